"""Mixture-of-experts models from transformers on neuron: one training step equals the CPU's.

Tiny configs (2 layers, hidden size 32, 4 experts, top-2), random weights, dropout off, the
router's auxiliary loss on where the model has one. Off the CPU, transformers counts tokens per
expert with torch.histc on int32 ids (the grouped_mm experts and the load-balancing loss), a dtype
the CPU kernel lacks and CUDA's has: see docs/op_support.md.
Each model's loss and gradients on neuron are compared with the CPU's, in eager and compiled with
torch.compile's default backend.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

TOL = dict(rtol=1e-4, atol=1e-5)
COMMON = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, attention_dropout=0.0, output_router_logits=True,
              router_aux_loss_coef=0.01, tie_word_embeddings=False)


def _mixtral():
    return transformers.MixtralConfig(**COMMON, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)


def _qwen2_moe():
    return transformers.Qwen2MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=24,
                                       shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                       decoder_sparse_step=1, mlp_only_layers=[])


def _qwen3_moe():
    return transformers.Qwen3MoeConfig(**COMMON, head_dim=8, intermediate_size=48, moe_intermediate_size=24,
                                       num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                       mlp_only_layers=[])


def _deepseek_v3():
    config = dict(COMMON, num_key_value_heads=4)
    return transformers.DeepseekV3Config(**config, intermediate_size=48, moe_intermediate_size=24,
                                         n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                         n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=16,
                                         kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _gpt_oss():
    return transformers.GptOssConfig(**COMMON, head_dim=8, intermediate_size=32, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"])


MODELS = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "deepseek_v3": _deepseek_v3,
          "gpt_oss": _gpt_oss}
# Compiled variants in the default suite (each compile takes tens of seconds on 2 cores).
COMPILED = ("mixtral", "qwen3_moe")


def _model(name):
    torch.manual_seed(0)
    config = MODELS[name]()
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.train()


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 12), generator=g)
    return ids, ids.clone()


def _step(model, ids, labels, run=None):
    out = (model if run is None else run)(input_ids=ids, labels=labels)
    out.loss.backward()
    aux = getattr(out, "aux_loss", None)  # DeepSeek-V3 has no load-balancing loss
    return out.loss.detach(), None if aux is None else aux.detach(), {n: p.grad for n, p in model.named_parameters()}


def _compare(name, compiled):
    ref = _model(name)
    model = copy.deepcopy(ref).to("neuron")
    ids, labels = _batch()
    want_loss, want_aux, want_grads = _step(ref, ids, labels)
    run = torch.compile(model) if compiled else model
    got_loss, got_aux, got_grads = _step(model, ids.to("neuron"), labels.to("neuron"), run)
    assert got_loss.device.type == "neuron"
    torch.testing.assert_close(got_loss.cpu(), want_loss, **TOL)
    assert (got_aux is None) == (want_aux is None)
    if want_aux is not None:
        torch.testing.assert_close(got_aux.cpu(), want_aux, **TOL)
        assert want_aux.item() > 0  # the load-balancing term ran
    assert got_grads.keys() == want_grads.keys()
    for key, want in want_grads.items():
        got = got_grads[key]
        assert (got is None) == (want is None), key
        if want is not None:
            torch.testing.assert_close(got.cpu(), want, **TOL, msg=lambda m, k=key: f"{name} {k}: {m}")


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_eager(name):
    _compare(name, compiled=False)


@pytest.mark.parametrize("name", COMPILED)
def test_training_step_compiled(name):
    torch._dynamo.reset()
    try:
        _compare(name, compiled=True)
    finally:
        torch._dynamo.reset()


def test_router_histc_counts_int32_expert_ids():
    """The routing statistic itself: histc of int32 ids (CUDA's dtype) counts as the CPU does in float."""
    ids = torch.randint(0, 8, (64,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    got = torch.histc(ids.to("neuron"), bins=8, min=0, max=8)
    assert got.dtype == torch.int32 and got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), torch.histc(ids.float(), bins=8, min=0, max=8).to(torch.int32))
