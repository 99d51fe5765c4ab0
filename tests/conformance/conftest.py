"""Shared set-up of the conformance suites.

Their helpers (opcheck, modcheck, ...) are imported from this directory. The
device cache is emptied afterwards. The thread count is left alone: switching
it leaves oneDNN in a state in which later CPU convolutions round differently.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def _clean_cache_and_global_flags():
    yield
    torch.neuron.empty_cache()  # the poisoned blocks (see opcheck.poison) go back
    # Importing torch.testing._internal.common_utils locks torch.backends flags
    # (disable_global_flags); unlock them for the suites that run after these.
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
