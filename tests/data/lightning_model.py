"""The LightningModule and data of the Lightning tests (tests/test_integrations_lightning.py)."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

STEPS = 3


def data(rows: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed inputs and targets, drawn on the CPU."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 1, generator=g)


class Regression(L.LightningModule):
    """A 2-layer MLP, weights drawn on the CPU from a fixed seed, trained with SGD on the MSE."""

    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        self.seen: set[str] = set()
        self.backend = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.update({str(x.device), *(str(p.device) for p in self.parameters())})
        if torch.distributed.is_initialized():
            self.backend = torch.distributed.get_backend()
        return torch.nn.functional.mse_loss(self.net(x), y)

    def train_dataloader(self):
        """Rank r of w takes rows r, r + w, r + 2w, ... in order: together, the ranks' batches of one step
        are the batch of ``batch_size * w`` rows one process would take (run with ``use_distributed_sampler=False``;
        Lightning's own sampler shuffles)."""
        x, y = data()
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return DataLoader(TensorDataset(x[rank::world], y[rank::world]), batch_size=self.batch_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
