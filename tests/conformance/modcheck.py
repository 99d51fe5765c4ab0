"""Checks one ModuleInfo on neuron against the CPU: .to("neuron"), forward, backward, state_dict.

For each module input: a module is built on the CPU (seeded), deep-copied and
moved with ``.to("neuron")``; both run the same inputs (neuron copies keep the
CPU layout) with the generators seeded alike; outputs, gradients of inputs and
parameters, and state dicts (after the forward, so running statistics count)
are compared. The state dict also goes through ``load_state_dict`` in both
directions and through ``torch.save``/``torch.load``.

Used by test_modules.py (pytest) and scripts/op_support.py.
"""

from __future__ import annotations

import copy
import io
import itertools
import time

import torch
from torch.utils._pytree import tree_flatten

from opcheck import (AspectResult, Mismatch, OpResult, _short, record_failure, compare_outcomes, compare_values,
                     copy_tensor, dtype_name, map_structure, run)

NEURON = "neuron:0"
MODULE_ASPECTS = ("to", "forward", "backward", "state_dict", "to_identity")
MODULE_DTYPES = (torch.float32, torch.float64)
DEFAULT_MAX_INPUTS = 12


def _to_neuron(obj):
    return map_structure(obj, lambda t: copy_tensor(t, NEURON) if t.device.type == "cpu" else t,
                         lambda d: d)


def _check_to(m_cpu, m_n):
    pc, pn = dict(m_cpu.named_parameters()), dict(m_n.named_parameters())
    bc, bn = dict(m_cpu.named_buffers()), dict(m_n.named_buffers())
    if pc.keys() != pn.keys() or bc.keys() != bn.keys():
        raise Mismatch(".to: parameter or buffer names changed")
    for name, p in pn.items():
        if isinstance(pc[name], torch.nn.parameter.UninitializedParameter):
            if not isinstance(p, torch.nn.parameter.UninitializedParameter):
                raise Mismatch(f".to: uninitialized (lazy) parameter {name} became a {type(p).__name__} "
                               f"of shape {tuple(p.shape)}; the module can no longer initialize it")
            continue
        if not isinstance(p, torch.nn.Parameter) or p.requires_grad != pc[name].requires_grad:
            raise Mismatch(f".to: parameter {name} lost its Parameter type or requires_grad")
        if p.device.type != "neuron":
            raise Mismatch(f".to: parameter {name} on {p.device}")
        compare_values(p, pc[name], f".to parameter {name}")
    for name, b in bn.items():
        if b is None or isinstance(b, torch.nn.parameter.UninitializedBuffer):
            continue
        if b.device.type != "neuron":
            raise Mismatch(f".to: buffer {name} on {b.device}")
        compare_values(b, bc[name], f".to buffer {name}")


def _check_state_dict(m_cpu, m_n):
    sc, sn = m_cpu.state_dict(), m_n.state_dict()
    if sc.keys() != sn.keys():
        raise Mismatch("state_dict: keys differ")
    for k, v in sn.items():
        if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.parameter.UninitializedParameter):
            if v.device.type != "neuron":
                raise Mismatch(f"state_dict: {k} on {v.device}")
    compare_values(dict(sn), dict(sc), "state_dict")
    # neuron -> CPU module, CPU -> neuron module
    back = copy.deepcopy(m_cpu)
    back.load_state_dict(sn)
    compare_values(dict(back.state_dict()), dict(sc), "load_state_dict(neuron state) into CPU module",
                   cpu_ok=True)
    for k, v in back.state_dict().items():
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            raise Mismatch(f"load_state_dict(neuron state) into a CPU module moved {k} to {v.device}")
    again = copy.deepcopy(m_n)
    again.load_state_dict(sc)
    for k, v in again.state_dict().items():
        if isinstance(v, torch.Tensor) and v.device.type != "neuron":
            raise Mismatch(f"load_state_dict(CPU state) moved {k} to {v.device}")
    compare_values(dict(again.state_dict()), dict(sc), "load_state_dict(CPU state) into neuron module")
    # serialization keeps the device
    buf = io.BytesIO()
    torch.save(sn, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    for k, v in loaded.items():
        if isinstance(v, torch.Tensor) and v.device.type != "neuron":
            raise Mismatch(f"torch.load: {k} on {v.device}")
    compare_values(dict(loaded), dict(sc), "torch.save/torch.load of the neuron state_dict")


def _grad_check(out_n, out_c, inputs_n, inputs_c, index):
    n_flat = [t for t in tree_flatten(out_n)[0]]
    c_flat = [t for t in tree_flatten(out_c)[0]]
    pairs = [(a, e) for a, e in zip(n_flat, c_flat)
             if isinstance(e, torch.Tensor) and e.requires_grad and (e.is_floating_point() or e.is_complex())]
    if not pairs or not inputs_c:
        return False
    gen = torch.Generator().manual_seed(index)
    cots_c = [torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e.dtype) if not e.is_complex()
              else torch.randn(e.shape, generator=gen, dtype=e.dtype) for _, e in pairs]
    cots_n = [c.to(NEURON) for c in cots_c]
    gc = run(lambda: torch.autograd.grad([e for _, e in pairs], inputs_c, cots_c, allow_unused=True))
    gn = run(lambda: torch.autograd.grad([a for a, _ in pairs], inputs_n, cots_n, allow_unused=True))
    if gc.error is not None or gn.error is not None:
        return compare_outcomes(gn, gc, "backward")
    for i, (a, e) in enumerate(zip(gn.value, gc.value)):
        if (a is None) != (e is None):
            raise Mismatch(f"backward: gradient {i} defined on one device only")
        if a is not None:
            compare_values(a, e, f"backward grad {i}")
    return True


def check_module(module_info, dtype, max_inputs=DEFAULT_MAX_INPUTS, trainings=None) -> OpResult:
    """Run every aspect of a ModuleInfo for ``dtype``; never raises."""
    t0 = time.perf_counter()
    result = OpResult(module_info.name, dtype_name(dtype))
    res = {a: AspectResult() for a in MODULE_ASPECTS}

    def fail(aspect, exc, desc):
        record_failure(res[aspect], exc, f"input {desc}")

    if trainings is None:
        trainings = (True, False) if module_info.train_and_eval_differ else (True,)
    for training in trainings:
        torch.manual_seed(0)
        try:
            inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype,
                                                    requires_grad=True, training=training)
        except Exception as e:  # noqa: BLE001
            for a in res:
                fail(a, Mismatch(f"module_inputs_func failed on the CPU: {_short(e)}"), "-")
            break
        inputs = [mi for mi in inputs if mi.forward_input is not None]
        for i, mi in enumerate(itertools.islice(inputs, max_inputs)):
            desc = f"#{i} {mi.desc or ''} training={training}"
            c_args, c_kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
            torch.manual_seed(i)
            built = run(lambda: module_info.module_cls(*c_args, **c_kwargs).to(dtype), seed=i)
            if built.error is not None:
                continue  # the CPU cannot build it either: nothing to compare
            m_cpu = built.value
            m_cpu.train(training)
            try:
                m_n = copy.deepcopy(m_cpu)
                before = list(m_n.parameters())
                m_n.to("neuron")
                _check_to(m_cpu, m_n)
                res["to"].samples += 1
            except Exception as e:  # noqa: BLE001
                fail("to", e, desc)
                continue
            if before:
                # as on CUDA, .to() keeps the Parameter objects (an optimizer made before still sees them)
                if all(a is b for a, b in zip(before, m_n.parameters())):
                    res["to_identity"].samples += 1
                else:
                    fail("to_identity", Mismatch(".to('neuron') replaced the Parameter objects instead of "
                                                 "moving their data (CUDA keeps them)"), desc)
            f_args, f_kwargs = mi.forward_input.args, mi.forward_input.kwargs
            try:
                n_args, n_kwargs = _to_neuron((f_args, f_kwargs))
            except Exception as e:  # noqa: BLE001
                fail("forward", Mismatch(f"copying inputs to neuron failed: {_short(e)}"), desc)
                continue
            oc = run(lambda: m_cpu(*f_args, **f_kwargs), seed=100 + i)
            on = run(lambda: m_n(*n_args, **n_kwargs), seed=100 + i)
            try:
                compared = compare_outcomes(on, oc, "forward")
                res["forward"].samples += compared
            except Exception as e:  # noqa: BLE001
                fail("forward", e, desc)
                continue
            if not compared:
                continue
            try:
                leaves_c = [t for t in tree_flatten((f_args, f_kwargs))[0]
                            if isinstance(t, torch.Tensor) and t.requires_grad]
                leaves_n = [t for t in tree_flatten((n_args, n_kwargs))[0]
                            if isinstance(t, torch.Tensor) and t.requires_grad]
                params_c = [p for p in m_cpu.parameters() if p.requires_grad]
                params_n = [p for p in m_n.parameters() if p.requires_grad]
                if _grad_check(on.value, oc.value, leaves_n + params_n, leaves_c + params_c, i):
                    res["backward"].samples += 1
            except Exception as e:  # noqa: BLE001
                fail("backward", e, desc)
            try:
                _check_state_dict(m_cpu, m_n)
                res["state_dict"].samples += 1
            except Exception as e:  # noqa: BLE001
                fail("state_dict", e, desc)
    for a, r in res.items():
        if r.status == "pass" and r.samples == 0:
            r.status = "n/a"
            r.reason = "no input exercised it"
    result.aspects = res
    result.seconds = time.perf_counter() - t0
    return result
