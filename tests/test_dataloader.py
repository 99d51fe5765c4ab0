"""torch.utils.data.DataLoader feeding neuron: worker processes, pinned batches, non-blocking copies.

PyTorch 2.13's DataLoader pins for the current accelerator (``pin_memory_device`` is
deprecated and ignored), which is neuron once torchneuron is loaded: ``pin_memory=True``
is all a user writes. Pinning runs in the loader's pin-memory thread, which first makes
current the device that was current when iteration began. tests/test_copies.py covers
pinning with one worker; here: two workers, a second device, and a training loop
compared with the CPU.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

N, FEATURES, CLASSES, BATCH, EPOCHS = 64, 12, 4, 8, 2


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, FEATURES, generator=g), torch.randint(0, CLASSES, (N,), generator=g))


def _loader(**kw) -> DataLoader:
    return DataLoader(_dataset(), batch_size=BATCH, num_workers=2, pin_memory=True, **kw)


def test_pinned_batches_from_two_workers():
    ds = _dataset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "no accelerator is found, device pinned memory won't be used"
        batches = list(_loader())
    assert len(batches) == N // BATCH
    for i, (x, y) in enumerate(batches):
        assert x.is_pinned() and y.is_pinned()
        xd, yd = x.to("neuron", non_blocking=True), y.to("neuron", non_blocking=True)
        assert xd.device == torch.device("neuron:0")
        torch.neuron.current_stream().synchronize()
        torch.testing.assert_close(xd.cpu(), ds.tensors[0][i * BATCH:(i + 1) * BATCH], rtol=0, atol=0)
        torch.testing.assert_close(yd.cpu(), ds.tensors[1][i * BATCH:(i + 1) * BATCH], rtol=0, atol=0)


def test_pinning_with_another_current_device(two_devices):
    torch.neuron.set_device(1)
    x, y = next(iter(_loader()))
    assert x.is_pinned() and y.is_pinned()
    xd = x.to(torch.neuron.current_device(), non_blocking=True)
    assert xd.device == torch.device("neuron:1")
    torch.neuron.synchronize(1)
    torch.testing.assert_close(xd.cpu(), _dataset().tensors[0][:BATCH], rtol=0, atol=0)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))


def _train(device: str):
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # Shuffled with a seeded CPU generator, so both runs see the same batches.
    loader = _loader(shuffle=True, generator=torch.Generator().manual_seed(3))
    losses = []
    for _ in range(EPOCHS):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    return torch.stack(losses).cpu(), {k: v.cpu() for k, v in model.state_dict().items()}


def test_training_loop_over_pinned_batches_matches_cpu():
    cpu_losses, cpu_state = _train("cpu")
    losses, state = _train("neuron")
    assert len(losses) == EPOCHS * N // BATCH and losses[-EPOCHS:].mean() < losses[:EPOCHS].mean()
    torch.testing.assert_close(losses, cpu_losses, rtol=0, atol=0)
    for k in cpu_state:
        torch.testing.assert_close(state[k], cpu_state[k], rtol=0, atol=0, msg=k)
