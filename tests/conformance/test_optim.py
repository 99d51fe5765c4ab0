"""PyTorch's OptimizerInfo database (``optim_db``) on neuron, compared with the CPU.

For every optimizer and every configuration PyTorch lists for it, including the
implementation flags it supports on this device (``foreach``,
``differentiable``; ``fused`` where PyTorch allows it for the device), a few
parameters of assorted shapes (a 0-d one included) take three steps with the
same gradients on neuron and on the CPU; parameters and optimizer state must
match. Runs in full in the default suite (about ten seconds).
"""

import copy

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_optimizers import (
    _get_optim_inputs_including_global_cliquey_kwargs, optim_db, optims)
from torch.testing._internal.common_utils import TestCase
from torch.utils._pytree import tree_map

from expected_failures import expected_optim_failure

STEPS = 3
SHAPES = [(4, 3), (3,), (), (2, 2, 2)]


def _bare(info):
    info = copy.copy(info)
    info.decorators = ()
    return info


OPTIMS = [_bare(o) for o in optim_db if not o.only_supports_sparse_grads]


def _run(info, kwargs, device, dtype):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g, dtype=dtype).to(device).requires_grad_() for s in SHAPES]
    opt = info.optim_cls(params, **kwargs)
    for step in range(STEPS):
        gg = torch.Generator().manual_seed(100 + step)
        grads = [torch.randn(p.shape, generator=gg, dtype=dtype).to(device) for p in params]

        def closure():
            opt.zero_grad()
            loss = sum((p * gr).sum() + (p * p).sum() for p, gr in zip(params, grads))
            loss.backward()
            return loss
        if info.step_requires_closure:
            opt.step(closure)
        else:
            for p, gr in zip(params, grads):
                p.grad = gr
            opt.step()
    state = [dict(s) for s in opt.state.values()]
    return params, state


class TestNeuronOptimInfo(TestCase):
    @optims(OPTIMS, dtypes=[torch.float32])
    def test_conformance(self, device, dtype, optim_info):
        name = optim_info.optim_cls.__name__
        problems = []
        configs = _get_optim_inputs_including_global_cliquey_kwargs(device, dtype, optim_info)
        to_cpu = lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x  # noqa: E731
        for cfg in configs:
            expected = expected_optim_failure(name, cfg.desc)
            try:
                try:
                    p_c, s_c = _run(optim_info, cfg.kwargs, "cpu", dtype)
                except Exception as e:  # noqa: BLE001  (the CPU rejects it: neuron must too)
                    with self.assertRaises(type(e)):
                        _run(optim_info, cfg.kwargs, device, dtype)
                    continue
                p_n, s_n = _run(optim_info, cfg.kwargs, device, dtype)
                for p in p_n:
                    assert p.device.type == "neuron", f"a parameter moved to {p.device}"
                torch.testing.assert_close([p.detach().cpu() for p in p_n], [p.detach() for p in p_c])
                torch.testing.assert_close(tree_map(to_cpu, s_n), tree_map(to_cpu, s_c))
                ok = True
            except Exception as e:  # noqa: BLE001
                ok = False
                if expected is None:
                    problems.append(f"{cfg.desc} {cfg.kwargs}: {type(e).__name__}: {' '.join(str(e).split())[:400]}")
            if ok and expected is not None and expected.strict:
                problems.append(f"{cfg.desc} passes but expected_failures.py lists it ({expected.reason})")
        if problems:
            self.fail(f"{name}:\n" + "\n".join(problems))


instantiate_device_type_tests(TestNeuronOptimInfo, globals(), only_for="privateuse1")
