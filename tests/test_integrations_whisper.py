"""OpenAI's whisper on neuron: the model moves to the device as is and decodes as on the CPU.

Whisper keeps a sparse COO buffer (``alignment_heads``), so ``model.to("neuron")`` needs sparse
tensors on the device. No weights are downloaded: the model is built from small dimensions with
seeded random weights, and the tokenizer's vocabulary ships inside the package.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

whisper = pytest.importorskip("whisper")

from whisper.decoding import DecodingOptions  # noqa: E402
from whisper.model import ModelDimensions, Whisper  # noqa: E402

# Multilingual vocabulary (51865 tokens), a short text context, two thin layers on each side.
DIMS = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=2, n_audio_layer=2,
                       n_vocab=51865, n_text_ctx=64, n_text_state=64, n_text_head=2, n_text_layer=2)


def _model() -> Whisper:
    torch.manual_seed(0)
    model = Whisper(DIMS).eval()
    with torch.no_grad():  # random weights large enough that the decoder's choices are not ties
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def _mel() -> torch.Tensor:
    """The log-mel spectrogram of two seconds of a 440 Hz tone, padded to whisper's 30 s window."""
    t = np.arange(2 * whisper.audio.SAMPLE_RATE, dtype=np.float32) / whisper.audio.SAMPLE_RATE
    audio = whisper.pad_or_trim(torch.from_numpy(0.5 * np.sin(2 * np.pi * 440.0 * t)))
    return whisper.log_mel_spectrogram(audio, n_mels=DIMS.n_mels)


def test_model_moves_to_neuron_with_its_sparse_buffer():
    cpu = _model()
    model = copy.deepcopy(cpu).to("neuron")
    heads = model.alignment_heads
    assert heads.is_sparse and heads.device.type == "neuron"
    assert heads._indices().device.type == "neuron" and heads._values().device.type == "neuron"
    torch.testing.assert_close(heads.to("cpu").to_dense(), cpu.alignment_heads.to_dense())
    assert all(p.device.type == "neuron" for p in model.parameters())


def test_set_alignment_heads_on_a_neuron_model():
    model = _model().to("neuron")
    mask = np.zeros((DIMS.n_text_layer, DIMS.n_text_head), dtype=bool)
    mask[1, 0] = True
    import base64
    import gzip
    model.set_alignment_heads(base64.b85encode(gzip.compress(mask.tobytes())))
    assert model.alignment_heads.device.type == "cpu"  # whisper builds it on the CPU, as it does for CUDA
    model.to("neuron")
    assert model.alignment_heads.device.type == "neuron"
    assert model.alignment_heads.to_dense().cpu().numpy().tolist() == mask.tolist()


def test_decode_gives_the_cpus_tokens():
    cpu = _model()
    model = copy.deepcopy(cpu).to("neuron")
    mel = _mel()
    options = DecodingOptions(language="en", without_timestamps=True, fp16=False, sample_len=24)
    expected = whisper.decode(cpu, mel, options)
    got = whisper.decode(model, mel.to("neuron"), options)
    assert got.tokens == expected.tokens
    assert got.text == expected.text
    assert len(expected.tokens) > 0
    assert got.avg_logprob == pytest.approx(expected.avg_logprob, rel=1e-4, abs=1e-5)
    # the encoder's output on the device equals the CPU's
    torch.testing.assert_close(model.embed_audio(mel.to("neuron")[None]).cpu(), cpu.embed_audio(mel[None]))


def test_word_alignment_reads_the_sparse_heads_on_neuron():
    """Word timestamps select cross-attention heads through ``alignment_heads.indices()``."""
    from whisper.timing import find_alignment
    from whisper.tokenizer import get_tokenizer

    cpu = _model()
    model = copy.deepcopy(cpu).to("neuron")
    tokenizer = get_tokenizer(True, num_languages=cpu.num_languages, language="en", task="transcribe")
    text_tokens = tokenizer.encode(" hello world, this is a test")
    mel = _mel()
    expected = find_alignment(cpu, tokenizer, text_tokens, mel, num_frames=200)
    got = find_alignment(model, tokenizer, text_tokens, mel.to("neuron"), num_frames=200)
    assert [w.word for w in got] == [w.word for w in expected] and len(expected) > 0
    assert [(w.start, w.end) for w in got] == [(w.start, w.end) for w in expected]
    np.testing.assert_allclose([w.probability for w in got], [w.probability for w in expected], rtol=1e-5)
