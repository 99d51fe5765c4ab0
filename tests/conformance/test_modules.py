"""PyTorch's ModuleInfo database (``module_db``) on neuron, compared with the CPU.

One test per module, dtype (float32, float64) and train/eval mode where they
differ, through PyTorch's device-generic machinery for the PrivateUse1 device:
``.to("neuron")``, forward, backward (inputs and parameters), state_dict
round trips, and whether ``.to`` keeps the Parameter objects (see
modcheck.py). Outcomes are held against expected_failures.py, strictly.

The default suite runs a quick slice (selection.QUICK_MODULES); every module
runs with ``TORCHNEURON_FULL_CONFORMANCE=1``.
"""

import copy

from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase

import modcheck
import selection
from expected_failures import crashes, expected_module_failure, problems
from opcheck import dtype_name


def _bare(module_info):
    module_info = copy.copy(module_info)
    module_info.decorators = ()
    return module_info


MODULES = [_bare(m) for m in selection.selected_modules(module_db)]


class TestNeuronModuleInfo(TestCase):
    @modules(MODULES, allowed_dtypes=modcheck.MODULE_DTYPES)
    def test_conformance(self, device, dtype, module_info, training):
        name, dname = module_info.name, dtype_name(dtype)
        crash = crashes(name, dname, module=True)
        if crash:
            self.skipTest(f"crashes the process, listed in expected_failures.py: {crash}")
        result = modcheck.check_module(module_info, dtype, trainings=(training,))
        found = problems(result, lambda aspect: expected_module_failure(name, dname, aspect), "inputs")
        if found:
            self.fail(f"{name} {dname} training={training}:\n" + "\n\n".join(found))


instantiate_device_type_tests(TestNeuronModuleInfo, globals(), only_for="privateuse1")
