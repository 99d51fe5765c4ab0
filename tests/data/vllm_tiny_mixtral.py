"""A small Mixtral (mixture of experts) with random weights and the tiny Llama's tokenizer, saved as a
Hugging Face model directory.

4 experts, top-2 routing, head size 32 (vLLM's CPU attention needs at least 32). Run as
``python vllm_tiny_mixtral.py DIR``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_tiny_llama import save_model, save_tokenizer  # noqa: E402


def build(directory: str, hidden: int = 128, layers: int = 2, heads: int = 4, experts: int = 4) -> str:
    from transformers import MixtralConfig, MixtralForCausalLM

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(root)
    config = MixtralConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                           head_dim=hidden // heads, max_position_embeddings=512, num_local_experts=experts,
                           num_experts_per_tok=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                           torch_dtype="float32")
    return save_model(MixtralForCausalLM, config, root, hidden, "tests/data/vllm_tiny_mixtral.py")


if __name__ == "__main__":
    print(build(sys.argv[1]))
