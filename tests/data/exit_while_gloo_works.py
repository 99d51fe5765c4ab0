"""Rank 0 exits while a gloo worker of its neuron process group still holds a collective on a tensor
made in Python, and the collective ends right before the interpreter finalises.

    torchrun --nproc-per-node 2 exit_while_gloo_works.py

Rank 0 leaves a broadcast of a CPU tensor in flight (handle dropped, never waited, no
destroy_process_group) and exits. Rank 1 sends it only once rank 0's exit hooks have begun, so it ends
while rank 0's main thread holds the GIL in its last exit hook. The gloo worker that ran it then lets go
of the tensor, which takes the GIL: the worker waits for it into the interpreter's finalisation, where
Python ends the thread inside PyTorch's noexcept release and the process aborts ("terminate called
without an active exception"), unless torchneuron's exit hook kept the work.
"""
import atexit
import os
import sys
import time

RANK = int(os.environ["RANK"])
if RANK == 0:
    # Exit hooks run last-registered first: registered before torch (which loads torchneuron and its
    # hook), this runs last. sum() over a range is C code that holds the GIL throughout (about 2 s).
    atexit.register(sum, range(200_000_000))

import logging  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torchneuron  # noqa: E402,F401

log = logging.getLogger("torchneuron")
log.setLevel(logging.DEBUG)
log.addHandler(logging.StreamHandler(sys.stdout))


class CleanupThatWaits:
    """A cleanup during finalisation that lets go of the GIL (I/O, a thread join)."""

    def __init__(self):
        self._sleep = time.sleep

    def __del__(self):
        self._sleep(0.5)


dist.init_process_group("neuron")
store = dist.distributed_c10d._get_default_store()
dist.barrier()
if RANK == 0:
    t = torch.ones(1 << 16)
    dist.broadcast(t, src=1, async_op=True)
    del t
    # Runs after torchneuron's exit hook, before sum(): rank 1 sends now.
    atexit.register(store.set, "exit_while_gloo_works", "go")
    cleanup = CleanupThatWaits()
    print("rank 0 leaves", flush=True)
else:
    store.wait(["exit_while_gloo_works"])
    time.sleep(0.3)  # rank 0 is in sum() by now
    t = torch.full((1 << 16,), 2.0)
    dist.broadcast(t, src=1)
    print("rank 1 sent", flush=True)
