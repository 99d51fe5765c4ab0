"""PyTorch's OpInfo database (``op_db``) on neuron, compared with the CPU.

Instantiated through PyTorch's device-generic machinery for the PrivateUse1
device (``neuron``): one test per op and dtype among float32, float64,
bfloat16, float16, int64, bool and complex64 that PyTorch's CPU kernels
support. Each test checks forward, backward, in-place, out= and a second
device (see opcheck.py) and holds the outcome against
expected_failures.py, strictly: an unlisted failure or a listed pass fails.

The default suite runs a quick slice (selection.QUICK_OPS); every op runs with
``TORCHNEURON_FULL_CONFORMANCE=1``.
"""

import copy

from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

import opcheck
import selection
from expected_failures import crashes, expected_op_failure, problems


def _bare(op):
    """The OpInfo without its CPU/CUDA-specific skips and decorators: expected_failures.py alone decides."""
    op = copy.copy(op)
    op.decorators = ()
    return op


OPS = [_bare(op) for op in selection.selected_ops(op_db)]


class TestNeuronOpInfo(TestCase):
    @ops(OPS, dtypes=OpDTypes.supported, allowed_dtypes=opcheck.DTYPES)
    def test_conformance(self, device, dtype, op):
        name, dname = op.full_name, opcheck.dtype_name(dtype)
        crash = crashes(name, dname)
        if crash:
            self.skipTest(f"crashes the process, listed in expected_failures.py: {crash}")
        result = opcheck.check_op(op, dtype, device=device)
        found = problems(result, lambda aspect: expected_op_failure(name, dname, aspect), "samples")
        if found:
            self.fail(f"{name} {dname}:\n" + "\n\n".join(found))


instantiate_device_type_tests(TestNeuronOpInfo, globals(), only_for="privateuse1")
