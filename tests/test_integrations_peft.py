"""PEFT's LoRA on neuron: a small GPT-2 fine-tuned with LoRA gives the CPU's numbers.

The model is built on the CPU from a config with seeded random weights (nothing is
downloaded) and moved to the device. LoRA's ``lora_B`` starts at zero, so the adapter
only matters once it has trained; the training test takes a few AdamW steps and
compares losses, the adapter's weights and the merged model's logits with the same
run on the CPU. The adapter is saved and loaded again on the device.
"""

from __future__ import annotations

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

STEPS = 4


def _base() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def _lora_config() -> LoraConfig:
    # GPT-2's c_attn is a Conv1D (weight stored as in x out), hence fan_in_fan_out.
    return LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True)


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))


def _lora_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if "lora_" in k}


def _train(device: str):
    model = get_peft_model(_base(), _lora_config()).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.device.type == device for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = _ids().to(device)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    lora = _lora_state(model)
    merged = model.merge_and_unload()
    with torch.no_grad():
        logits = merged(input_ids=ids).logits.cpu()
    return torch.stack(losses), lora, logits, merged


def test_lora_training_and_merge_match_cpu():
    cpu_losses, cpu_lora, cpu_logits, _ = _train("cpu")
    losses, lora, logits, merged = _train("neuron")

    assert losses[-1] < losses[0]
    torch.testing.assert_close(losses, cpu_losses, rtol=0, atol=0)
    assert lora.keys() == cpu_lora.keys() and len(lora) == 4  # A and B of c_attn in 2 layers
    for k in lora:
        torch.testing.assert_close(lora[k], cpu_lora[k], rtol=0, atol=0, msg=k)
    assert any(v.abs().sum() > 0 for k, v in lora.items() if "lora_B" in k)  # the adapter trained

    # merge_and_unload gives back the plain transformers model, still on the device.
    assert type(merged) is GPT2LMHeadModel
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    assert all(p.device.type == "neuron" for p in merged.parameters())
    torch.testing.assert_close(logits, cpu_logits, rtol=0, atol=0)
    with torch.no_grad():  # the merged weights changed the base model's output
        assert not torch.equal(logits, _base()(input_ids=_ids()).logits)


def test_adapter_save_and_load_on_neuron(tmp_path):
    model = get_peft_model(_base(), _lora_config()).to("neuron")
    with torch.no_grad():  # a non-zero adapter, drawn on the CPU
        g = torch.Generator().manual_seed(2)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ids = _ids()
    with torch.no_grad():
        expected = model(input_ids=ids.to("neuron")).logits.cpu()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").exists() and (tmp_path / "adapter_config.json").exists()

    # Loaded onto a base model on the device: the adapter's layers follow the base layers.
    loaded = PeftModel.from_pretrained(_base().to("neuron"), tmp_path)
    assert all(p.device.type == "neuron" for p in loaded.parameters())
    for k, v in _lora_state(model).items():
        torch.testing.assert_close(loaded.state_dict()[k].cpu(), v, rtol=0, atol=0, msg=k)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids.to("neuron")).logits.cpu(), expected, rtol=0, atol=0)

    # The files hold plain CPU tensors: the same adapter loads on a CPU-only machine.
    on_cpu = PeftModel.from_pretrained(_base(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(on_cpu(input_ids=ids).logits, expected, rtol=0, atol=0)
