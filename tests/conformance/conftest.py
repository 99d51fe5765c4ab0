"""Shared set-up of the conformance suites.

Their helpers (opcheck, modcheck, ...) are imported from this directory. Each
suite runs with one intra-op thread: the inputs are small, and on a busy
machine PyTorch's thread pool costs far more than it gains. The device cache
is emptied afterwards.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def _one_thread_and_clean_cache():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.neuron.empty_cache()  # the poisoned blocks (see opcheck.poison) go back
