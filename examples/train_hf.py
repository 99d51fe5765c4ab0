"""Fine-tune a small Llama with the Hugging Face Trainer on random token data (no downloads).

The script never names a device: the Trainer finds the neuron device by itself.
`python examples/train_hf.py [--max-steps N]`
"""
import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, n, seq, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--max-steps", type=int, default=8)
cli = parser.parse_args()

config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256)
model = LlamaForCausalLM(config)
args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="train_hf_"), per_device_train_batch_size=8,
                         max_steps=cli.max_steps, learning_rate=1e-3, logging_steps=4, report_to=[], save_strategy="no")
trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(64, 128, config.vocab_size))
result = trainer.train()
print("device", trainer.model.device, "train loss", round(result.training_loss, 4))
