"""Quick CPU tests of the demo GPT, its tokenizer, the batch sampler, the demo and its CLI."""

import io
import math

import pytest
import torch

from torchneuron.cli import build_parser, main
from torchneuron.data import load_text
from torchneuron.demo import LEARNING_RATE, learning_rate, run_demo
from torchneuron.models import GPT, CharTokenizer, GPTConfig, get_batch

TINY = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _model(config=TINY, seed=0):
    """Return a tiny GPT in eval mode built under ``seed``."""
    torch.manual_seed(seed)
    return GPT(config).eval()


def test_forward_shapes_and_initial_loss():
    model = _model()
    idx = torch.randint(TINY.vocab_size, (3, TINY.block_size))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, TINY.block_size, TINY.vocab_size)
    assert loss.dim() == 0
    # Small initial weights give a near-uniform prediction.
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.5
    assert model(idx)[1] is None


def test_tied_and_untied_heads():
    tied = _model()
    untied = _model(GPTConfig(**{**TINY.__dict__, "tie_weights": False}))
    assert tied.lm_head is None
    assert untied.lm_head.weight.shape == (TINY.vocab_size, TINY.n_embd)
    extra = TINY.vocab_size * TINY.n_embd
    assert untied.num_parameters() - tied.num_parameters() == extra


def test_causal_masking():
    model = _model()
    idx = torch.randint(TINY.vocab_size, (1, TINY.block_size))
    changed = idx.clone()
    changed[0, 10] = (changed[0, 10] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_context_longer_than_block_size_is_rejected():
    with pytest.raises(ValueError, match="block_size"):
        _model()(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))


def test_bad_head_count_is_rejected():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)


def test_generate_is_reproducible_and_crops_context():
    model = _model()
    start = torch.zeros(1, 1, dtype=torch.long)
    n = TINY.block_size + 5
    a = model.generate(start, n, generator=torch.Generator().manual_seed(1))
    b = model.generate(start, n, generator=torch.Generator().manual_seed(1))
    assert a.shape == (1, n + 1)
    assert torch.equal(a, b)
    top1 = model.generate(start, 3, top_k=1)
    assert torch.equal(top1, model.generate(start, 3, top_k=1))


def test_tokenizer_round_trip():
    text = "Shall I compare thee to a summer's day?\n"
    tok = CharTokenizer(text)
    assert tok.vocab_size == len(set(text))
    assert tok.chars == sorted(tok.chars)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("Z")


def test_tokenizer_rejects_empty_text():
    with pytest.raises(ValueError):
        CharTokenizer("")


def test_get_batch_targets_are_shifted_inputs():
    data = torch.arange(100)
    x, y = get_batch(data, 8, 4, torch.Generator().manual_seed(0), "cpu")
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)
    x2, _ = get_batch(data, 8, 4, torch.Generator().manual_seed(0), "cpu")
    assert torch.equal(x, x2)
    with pytest.raises(ValueError):
        get_batch(torch.arange(8), 8, 1, None, "cpu")


def test_corpus_ships_with_the_package():
    text = load_text()
    assert 100_000 <= len(text.encode("utf-8")) <= 200_000
    assert text.isascii()
    assert "Four score and seven years ago" in text


def test_learning_rate_schedule():
    peak = LEARNING_RATE
    assert learning_rate(0, 200) == pytest.approx(peak / 20)
    assert learning_rate(0, 200) < learning_rate(19, 200) <= peak
    assert learning_rate(199, 200) == pytest.approx(0.1 * peak)
    assert learning_rate(199, 200) < learning_rate(100, 200) < learning_rate(19, 200)


def test_run_demo_matches_on_cpu():
    out = io.StringIO()
    result = run_demo(steps=3, device="cpu", console=out, sample_chars=20, progress=False)
    assert result["match"] is True
    assert result["max_loss_diff"] == 0.0
    assert len(result["losses"]["compare"]) == len(result["losses"]["device"]) == 3
    assert result["tokens_per_s"]["device"] > 0
    assert len(result["sample"]) == 20
    assert "PASS" in out.getvalue()


def test_cli_registers_demo_and_needs_a_command(capsys):
    args = build_parser().parse_args(["demo", "--steps", "5", "--device", "cpu", "--compile", "--seed", "3"])
    assert (args.steps, args.device, args.compare_device, args.compile, args.seed) == (5, "cpu", "cpu", True, 3)
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--steps", "0"])
