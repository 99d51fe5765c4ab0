"""A small Llama with random weights and a byte-level BPE tokenizer, saved as a Hugging Face model directory.

vLLM's CPU attention needs a head size of at least 32; 2 key-value heads let
tensor parallelism split them over 2 ranks. Run as ``python vllm_tiny_llama.py DIR [HIDDEN LAYERS HEADS]``
(benchmarks/bench_serving.py builds a larger one).
"""

import json
import sys
from pathlib import Path

TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, this is a small test of serving",
        "a neuron device runs the model", "tokens come one at a time from the model"] * 8


def save_tokenizer(root: Path):
    """A byte-level BPE tokenizer trained on TEXT, saved in ``root``; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=384, special_tokens=special,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    tokenizer.save_pretrained(root)
    return tokenizer


def build(directory: str, hidden: int = 128, layers: int = 2, heads: int = 4) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(root)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                         head_dim=hidden // heads, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")
    return save_model(LlamaForCausalLM, config, root, hidden, "tests/data/vllm_tiny_llama.py")


def save_model(model_class, config, root: Path, hidden: int, built_by: str) -> str:
    """``model_class(config)`` with seeded random weights, saved into ``root`` as safetensors."""
    import torch

    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():  # larger weights than the default init: greedy tokens that vary with the prompt
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2 * (128 / hidden) ** 0.5)
    model.save_pretrained(root, safe_serialization=True)
    json.dump({"built_by": built_by}, open(root / "tiny.json", "w"))
    return str(root)


if __name__ == "__main__":
    # vllm_tiny_llama.py DIR [HIDDEN LAYERS HEADS]
    print(build(sys.argv[1], *map(int, sys.argv[2:5])))
