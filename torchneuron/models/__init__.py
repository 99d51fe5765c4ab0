"""Small reference models used by the demo and the tests."""

from torchneuron.models.gpt import GPT, CharTokenizer, GPTConfig, get_batch

__all__ = ["GPT", "GPTConfig", "CharTokenizer", "get_batch"]
