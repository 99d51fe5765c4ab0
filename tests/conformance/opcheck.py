"""Checks one OpInfo on neuron against the CPU.

Aspects: forward, backward, gradgrad and forward-mode AD (float32), the in-place
variant, the out= variant (empty, sized and noncontiguous outs) and a run on
neuron:1. Every check runs the same procedure on the CPU and on neuron and
compares all it observed: returned values (dtype, shape, device, values),
mutated arguments, gradients and raised errors. Samples are generated on
neuron (so sample creation exercises the device too) and copied to the CPU
with their exact layout (sizes, strides, storage offset, conjugate/negative
bits); freed device blocks are poisoned before each sample so that reads of
uninitialized device memory show.

Used by test_opinfo.py (pytest) and scripts/op_support.py (the support table).
"""

from __future__ import annotations

import contextlib
import itertools
import time
import traceback
import warnings
from dataclasses import dataclass, field

import torch

from torchneuron.migrate.host_rng import HostRNGMode
from torch.testing._internal.common_utils import noncontiguous_like
from torch.utils._pytree import tree_flatten

NEURON = "neuron:0"

#: Dtypes the conformance covers (each op runs those it supports on the CPU).
DTYPES = (
    torch.float32, torch.float64, torch.bfloat16, torch.float16,
    torch.int64, torch.bool, torch.complex64,
)

#: Check aspects, in the order they run.
ASPECTS = ("forward", "backward", "gradgrad", "fwad", "inplace", "out", "device1")
#: dtypes and samples of the second-order (gradgrad) and forward-mode AD (fwad) checks.
HIGHER_ORDER_DTYPES = (torch.float32,)
HIGHER_ORDER_SAMPLES = 8

#: Ops whose outputs are uninitialized memory: only metadata (dtype, shape, device) is compared.
UNINITIALIZED_OUTPUTS = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
}

#: Samples per op and dtype (the first ones the OpInfo yields), plus noncontiguous twins of the first few.
DEFAULT_MAX_SAMPLES = 64
NONCONTIGUOUS_SAMPLES = 3
#: "sample" (op.sample_inputs) or "reference" (op.reference_inputs: more edge cases, slower).
DEFAULT_INPUTS = "sample"

#: Results must match the CPU to assert_close's default tolerances for the dtype; a result within
#: this looser tolerance (the one PyTorch's TestCommon.test_compare_cpu allows an accelerator)
#: passes with a note, as it means neuron ran a different code path than the CPU.
LOOSE_TOL = 1e-3
NOTES: list = []


#: Block sizes of the device's caching allocator that get poisoned before each sample (see poison()).
_POISON_BYTES = ([512 * k for k in range(1, 9)] * 8 + [512 * k for k in range(9, 33)] * 2
                 + [1 << k for k in range(15, 21)])


def poison(device=NEURON):
    """Fill freed device blocks with a recognizable pattern (0x40 bytes: 3.0 in float32).

    The caching allocator hands these blocks out again, so a kernel that returns or
    reads uninitialized device memory shows garbage reproducibly instead of
    whatever zeros a fresh block happens to hold.
    """
    blocks = [torch.empty(n, dtype=torch.uint8, device=device) for n in _POISON_BYTES]
    for b in blocks:
        b.fill_(0x40)
    del blocks


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class Mismatch(AssertionError):
    """neuron and the CPU disagree."""


@dataclass
class AspectResult:
    status: str = "pass"          # pass | fail | n/a
    samples: int = 0              # samples compared
    reason: str = ""              # first failure, one line
    detail: str = ""              # traceback / full message of the first failure
    note: str = ""                # passed, but only within LOOSE_TOL (first such note)


@dataclass
class OpResult:
    op: str
    dtype: str
    aspects: dict = field(default_factory=dict)   # aspect -> AspectResult
    seconds: float = 0.0

    def status(self, aspect):
        r = self.aspects.get(aspect)
        return r.status if r else "n/a"


# ---- moving samples between devices ---------------------------------------------------------------

def copy_tensor(t: torch.Tensor, device) -> torch.Tensor:
    """A copy of ``t`` on ``device`` with the same sizes, strides, storage offset and view bits."""
    if t.layout != torch.strided:
        return t.detach().to(device)
    with torch.no_grad():
        src = t.detach()
        conj, neg = src.is_conj(), src.is_neg()
        if conj:
            src = src.conj()
        if neg:
            src = src._neg_view()
        n = src.untyped_storage().nbytes() // src.element_size()
        base = torch.empty(0, dtype=src.dtype, device=src.device).set_(
            src.untyped_storage(), 0, (n,), (1,))
        out = base.to(device, copy=True).as_strided(src.size(), src.stride(), src.storage_offset())
        if neg:
            out = out._neg_view()
        if conj:
            out = out.conj()
    return out.requires_grad_(t.requires_grad) if t.requires_grad else out


def _is_neuron_device(x):
    if isinstance(x, torch.device):
        return x.type == "neuron"
    return isinstance(x, str) and (x == "neuron" or x.startswith("neuron:"))


def map_structure(obj, fn_tensor, fn_device, memo=None):
    """Map tensors (memoized by identity, so aliasing survives) and device arguments in a sample."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = id(obj)
        if key not in memo:
            memo[key] = (obj, fn_tensor(obj))
        return memo[key][1]
    if _is_neuron_device(obj):
        return fn_device(obj)
    if isinstance(obj, list):
        return [map_structure(o, fn_tensor, fn_device, memo) for o in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(map_structure(o, fn_tensor, fn_device, memo) for o in obj)
    if isinstance(obj, dict):
        return {k: map_structure(v, fn_tensor, fn_device, memo) for k, v in obj.items()}
    return obj


def _is_cpu_device(x):
    if isinstance(x, torch.device):
        return x.type == "cpu"
    return isinstance(x, str) and (x == "cpu" or x.startswith("cpu:"))


def _walk(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _walk(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _walk(o)
    else:
        yield obj


class Pair:
    """One sample as two independent twins, on neuron and on the CPU.

    Every tensor becomes a fresh leaf on each side (same layout, same
    requires_grad), so both runs start from identical autograd states whatever
    the sample function did (views made under no_grad, shared tensors...).
    Tensors appearing twice in a sample stay shared on each side.
    """

    def __init__(self, sample):
        self.neuron = sample
        self.memo_n, self.memo_c = {}, {}
        raw = (sample.input, sample.args, sample.kwargs)
        leaves = list(_walk(raw))
        # results may live on the CPU only if the sample asks for it or has no neuron tensor at all
        self.cpu_ok = any(_is_cpu_device(x) for x in leaves) or not any(
            isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in leaves)
        self.neuron_args = map_structure(raw, lambda t: copy_tensor(t, t.device), lambda d: d, self.memo_n)
        self.cpu_args = map_structure(raw, lambda t: copy_tensor(t, "cpu"), lambda d: torch.device("cpu"),
                                      self.memo_c)

    def leaves(self):
        """(neuron tensor, cpu tensor) pairs that require grad, in a fixed order."""
        pairs = []
        for key, (_, n) in self.memo_n.items():
            c = self.memo_c[key][1]
            if n.requires_grad and (n.dtype.is_floating_point or n.is_complex()):
                pairs.append((n, c))
        return pairs

    def detached(self, clone_input=False):
        """Gradient-free copies of both samples (fresh clones of the inputs if asked)."""
        def prep(args):
            inp, a, k = args
            inp2 = inp.detach().clone() if clone_input and isinstance(inp, torch.Tensor) else inp
            return map_structure((inp2, a, k), lambda t: t.detach(), lambda d: d)
        return prep(self.neuron_args), prep(self.cpu_args)


# ---- running and comparing -------------------------------------------------------------------------

@dataclass
class Outcome:
    value: object = None
    error: BaseException | None = None


def run(fn, seed=1234):
    """Call fn with the random generators seeded, capture its result or error.

    Random ops on neuron tensors draw from the CPU generator here (HostRNGMode), so that both sides
    see the same numbers; the device's own Philox stream is checked in tests/test_random.py.
    """
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings(), HostRNGMode():
            warnings.simplefilter("ignore")
            return Outcome(value=fn())
    except Exception as e:  # noqa: BLE001
        return Outcome(error=e)


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first}"[:300]


def compare_outcomes(n: Outcome, c: Outcome, what: str, metadata_only=False, cpu_ok=False):
    if c.error is not None:
        if n.error is None:
            raise Mismatch(f"{what}: CPU raised {_short(c.error)} but neuron did not")
        return False  # both raised: consistent, nothing more to compare
    if n.error is not None:
        raise Mismatch(f"{what}: neuron raised {_short(n.error)} (CPU ran fine)") from n.error
    compare_values(n.value, c.value, what, metadata_only, cpu_ok)
    return True


def compare_values(actual, expected, what, metadata_only=False, cpu_ok=False):
    a_flat, a_spec = tree_flatten(actual)
    e_flat, e_spec = tree_flatten(expected)
    if len(a_flat) != len(e_flat):
        raise Mismatch(f"{what}: neuron returned {len(a_flat)} leaves, CPU {len(e_flat)}")
    for i, (a, e) in enumerate(zip(a_flat, e_flat)):
        where = f"{what}[{i}]" if len(e_flat) > 1 else what
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{where}: neuron returned {type(a).__name__}, CPU a tensor")
            if a.device.type != "neuron" and not cpu_ok:
                # a result of neuron inputs stays on neuron unless the sample asks for the CPU
                raise Mismatch(f"{where}: result on {a.device}, expected neuron")
            if a.dtype != e.dtype or a.shape != e.shape:
                raise Mismatch(f"{where}: neuron {a.dtype}{tuple(a.shape)} vs CPU {e.dtype}{tuple(e.shape)}")
            if metadata_only:
                continue
            a_cpu = a.detach().cpu() if a.device.type != "cpu" else a.detach()
            try:
                torch.testing.assert_close(a_cpu, e.detach(), equal_nan=True, check_device=False,
                                           check_layout=True)
            except AssertionError as err:
                try:  # the tolerance of PyTorch's own CPU/accelerator comparison (test_compare_cpu)
                    torch.testing.assert_close(a_cpu, e.detach(), equal_nan=True, check_device=False,
                                               atol=LOOSE_TOL, rtol=LOOSE_TOL)
                except AssertionError:
                    raise Mismatch(f"{where}: values differ: " + " ".join(str(err).split())[:400]) from None
                NOTES.append(f"{where}: differs from the CPU beyond default tolerances, within "
                             f"{LOOSE_TOL:g} (a different code path or order of accumulation)")
        elif isinstance(e, (int, float, complex)) and not isinstance(e, bool):
            if not isinstance(a, (int, float, complex)) or isinstance(a, bool):
                raise Mismatch(f"{where}: neuron returned {a!r}, CPU {e!r}")
            try:
                torch.testing.assert_close(a, e, equal_nan=True)
            except AssertionError:
                raise Mismatch(f"{where}: neuron returned {a!r}, CPU {e!r}") from None
        else:
            if isinstance(e, torch.device) or isinstance(e, torch.Size) or isinstance(e, torch.dtype):
                ok = (a == e) or (isinstance(e, torch.device) and e.type == "cpu")
            else:
                try:
                    ok = bool(a == e)
                except Exception:  # noqa: BLE001
                    ok = type(a) is type(e)
            if not ok:
                raise Mismatch(f"{where}: neuron returned {a!r}, CPU {e!r}")


def call(op, args, out=None):
    inp, a, k = args
    if out is not None:
        return op(inp, *a, **k, out=out)
    return op(inp, *a, **k)


# ---- the aspects -----------------------------------------------------------------------------------

def _grad_outputs(op, pair, n_out, c_out):
    """Differentiable outputs on both sides (after output_process_fn_grad)."""
    proc = pair.neuron.output_process_fn_grad
    n_flat, _ = tree_flatten(proc(n_out))
    c_flat, _ = tree_flatten(proc(c_out))
    outs_n, outs_c = [], []
    for a, e in zip(n_flat, c_flat):
        if isinstance(e, torch.Tensor) and e.requires_grad and (e.dtype.is_floating_point or e.is_complex()):
            if not (isinstance(a, torch.Tensor) and a.requires_grad):
                raise Mismatch("backward: a CPU output requires grad but its neuron twin does not")
            outs_n.append(a)
            outs_c.append(e)
    return outs_n, outs_c


def check_backward(op, pair, n_out, c_out, sample_index):
    outs_n, outs_c = _grad_outputs(op, pair, n_out, c_out)
    leaves = pair.leaves()
    if not outs_c or not leaves:
        return False
    gen = torch.Generator().manual_seed(sample_index)
    cots_c = []
    for t in outs_c:
        if t.is_complex():
            cots_c.append(torch.randn(t.shape, generator=gen, dtype=t.dtype))
        else:
            cots_c.append(torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype))
    cots_n = [c.to(NEURON) for c in cots_c]
    n_inputs = [n for n, _ in leaves]
    c_inputs = [c for _, c in leaves]
    gc = run(lambda: torch.autograd.grad(outs_c, c_inputs, cots_c, allow_unused=True))
    gn = run(lambda: torch.autograd.grad(outs_n, n_inputs, cots_n, allow_unused=True))
    if gc.error is not None or gn.error is not None:
        return compare_outcomes(gn, gc, "backward")
    for i, (a, e, leaf) in enumerate(zip(gn.value, gc.value, n_inputs)):
        if (a is None) != (e is None):
            raise Mismatch(f"backward: gradient {i} is {'None' if a is None else 'defined'} on neuron, "
                           f"{'None' if e is None else 'defined'} on CPU")
        if a is not None:
            if a.device != leaf.device:
                raise Mismatch(f"backward: gradient {i} on {a.device}, its input on {leaf.device}")
            compare_values(a, e, f"backward grad {i}", cpu_ok=True)
    return True


def _randn_like(t, gen):
    if t.is_complex():
        return torch.randn(t.shape, generator=gen, dtype=t.dtype)
    return torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)


def check_gradgrad(op, pair, index):
    """Second-order gradients: grad of <grad(out, inputs, v), w> with respect to the inputs."""
    leaves = pair.leaves()
    if not leaves:
        return False
    n_inputs, c_inputs = [n for n, _ in leaves], [c for _, c in leaves]
    gen = torch.Generator().manual_seed(1000 + index)

    def side(args, inputs, device):
        torch.manual_seed(1234)
        out = call(op, args)
        outs = [t for t in tree_flatten(pair.neuron.output_process_fn_grad(out))[0]
                if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]
        return outs
    oc = run(lambda: side(pair.cpu_args, c_inputs, "cpu"))
    on = run(lambda: side(pair.neuron_args, n_inputs, NEURON))
    if oc.error is not None or on.error is not None:
        return compare_outcomes(on, oc, "gradgrad forward")
    if not oc.value:
        return False
    # the cotangents are differentiable too (as in gradgradcheck), so linear ops take part
    cots_c = [_randn_like(t, gen).requires_grad_() for t in oc.value]
    cots_n = [c.detach().to(NEURON).requires_grad_() for c in cots_c]
    c_inputs, n_inputs = c_inputs + cots_c, n_inputs + cots_n
    g1c = run(lambda: torch.autograd.grad(oc.value, c_inputs, cots_c, create_graph=True, allow_unused=True))
    g1n = run(lambda: torch.autograd.grad(on.value, n_inputs, cots_n, create_graph=True, allow_unused=True))
    if g1c.error is not None or g1n.error is not None:
        return compare_outcomes(g1n, g1c, "gradgrad first grad")
    keep = [k for k, g in enumerate(g1c.value) if g is not None and g.requires_grad]
    if not keep or any(g1n.value[k] is None or not g1n.value[k].requires_grad for k in keep):
        if any(g1n.value[k] is None for k in keep):
            raise Mismatch("gradgrad: a first-order gradient is None on neuron but not on the CPU")
        return False
    cots2 = [_randn_like(g1c.value[k], gen) for k in keep]
    g2c = run(lambda: torch.autograd.grad([g1c.value[k] for k in keep], c_inputs, cots2, allow_unused=True))
    g2n = run(lambda: torch.autograd.grad([g1n.value[k] for k in keep], n_inputs, [c.to(NEURON) for c in cots2],
                                          allow_unused=True))
    if g2c.error is not None or g2n.error is not None:
        return compare_outcomes(g2n, g2c, "gradgrad")
    for k, (a, e) in enumerate(zip(g2n.value, g2c.value)):
        if (a is None) != (e is None):
            raise Mismatch(f"gradgrad: second-order gradient {k} defined on one device only")
        if a is not None:
            compare_values(a, e, f"gradgrad {k}", cpu_ok=True)
    return True


def check_fwad(op, pair, index):
    """Forward-mode AD: the tangents of every output for random tangents of the float inputs."""
    import torch.autograd.forward_ad as fwAD
    leaves = pair.leaves()
    if not leaves:
        return False
    gen = torch.Generator().manual_seed(2000 + index)
    tangents = [_randn_like(c, gen) for _, c in leaves]

    def side(args, inputs, tans):
        with fwAD.dual_level():
            duals = {id(t): fwAD.make_dual(t.detach(), tan.to(t.device)) for t, tan in zip(inputs, tans)}
            args2 = map_structure(args, lambda t: duals.get(id(t), t.detach()), lambda d: d)
            torch.manual_seed(1234)
            out = call(op, args2)
            result = []
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    p, t = fwAD.unpack_dual(o)
                    result.append((p.clone(), None if t is None else t.clone()))
            return result
    with torch.no_grad():
        oc = run(lambda: side(pair.cpu_args, [c for _, c in leaves], tangents))
        on = run(lambda: side(pair.neuron_args, [n for n, _ in leaves], tangents))
    if oc.error is not None or on.error is not None:
        return compare_outcomes(on, oc, "fwad")
    for k, ((pn, tn), (pc, tc)) in enumerate(zip(on.value, oc.value)):
        if (tn is None) != (tc is None):
            raise Mismatch(f"fwad: tangent of output {k} defined on one device only")
        compare_values(pn, pc, f"fwad primal {k}", cpu_ok=pair.cpu_ok)
        if tn is not None:
            compare_values(tn, tc, f"fwad tangent {k}", cpu_ok=pair.cpu_ok)
    return True


def record_failure(r, exc, where):
    """Mark the AspectResult ``r`` failed by ``exc`` (its first failure is kept), naming ``where`` it happened."""
    if r.status != "fail":
        r.status = "fail"
        msg = str(exc) if isinstance(exc, Mismatch) else _short(exc)
        r.reason = " ".join(msg.split())[:500]
        r.detail = f"{where}\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]


def check_op(op, dtype, max_samples=DEFAULT_MAX_SAMPLES, aspects=ASPECTS, device=NEURON,
             inputs=None) -> OpResult:
    """Run every aspect of ``op`` for ``dtype`` on neuron and the CPU; never raises.

    ``inputs`` is "sample" (``op.sample_inputs``) or "reference" (``op.reference_inputs``,
    a superset with more edge cases, as PyTorch's test_compare_cpu uses).
    """
    t0 = time.perf_counter()
    inputs = inputs or DEFAULT_INPUTS
    result = OpResult(op.full_name, dtype_name(dtype))
    do_grad = "backward" in aspects and dtype in op.supported_backward_dtypes("cpu")
    metadata_only = op.name in UNINITIALIZED_OUTPUTS or op.full_name in UNINITIALIZED_OUTPUTS

    res = {a: AspectResult(status="n/a") for a in aspects}
    active = {"forward"}
    if do_grad:
        active.add("backward")
    if "inplace" in aspects and op.inplace_variant is not None:
        active.add("inplace")
    if "out" in aspects and op.supports_out:
        active.add("out")
    if "device1" in aspects and dtype == torch.float32 and torch.neuron.device_count() > 1:
        active.add("device1")
    if "gradgrad" in aspects and do_grad and op.supports_gradgrad and dtype in HIGHER_ORDER_DTYPES:
        active.add("gradgrad")
    if "fwad" in aspects and op.supports_forward_ad and dtype in HIGHER_ORDER_DTYPES:
        active.add("fwad")
    for a in active:
        if a in res:
            res[a].status = "pass"

    def fail(aspect, exc, sample_desc):
        record_failure(res[aspect], exc, f"sample {sample_desc}")

    def attempt(aspect, fn, desc):
        """Run one check of an aspect; count it if it compared something, note loose matches."""
        if aspect not in active or res[aspect].status != "pass":
            return None
        NOTES.clear()
        try:
            compared = fn()
        except Exception as e:  # noqa: BLE001
            fail(aspect, e, desc)
            return None
        if compared:
            res[aspect].samples += 1
        if NOTES and not res[aspect].note:
            res[aspect].note = f"{NOTES[0]} [sample {desc}]"[:500]
        return compared

    torch.manual_seed(0)
    try:
        gen = op.reference_inputs if inputs == "reference" else op.sample_inputs
        samples = list(itertools.islice(gen(device, dtype, requires_grad=do_grad), max_samples))
        extra = []
        for s in samples[:NONCONTIGUOUS_SAMPLES]:
            try:
                extra.append(s.noncontiguous())
            except Exception:  # noqa: BLE001  (an input structure noncontiguous() cannot handle)
                pass
        samples += extra
    except Exception as e:  # noqa: BLE001
        for a in active:
            fail(a, Mismatch(f"sample_inputs on neuron failed: {_short(e)}"), "-")
        result.aspects = res
        result.seconds = time.perf_counter() - t0
        return result

    for i, sample in enumerate(samples):
        desc = f"#{i} {sample.summary() if hasattr(sample, 'summary') else sample}"[:600]
        try:
            pair = Pair(sample)
        except Exception as e:  # noqa: BLE001
            for a in active:
                fail(a, Mismatch(f"copying the sample failed: {_short(e)}"), desc)
            continue

        poison(device)
        # forward (and backward from the same outputs)
        if res["forward"].status == "pass" or res.get("backward", AspectResult("n/a")).status == "pass":
            with contextlib.nullcontext() if do_grad else torch.no_grad():
                oc = run(lambda: call(op, pair.cpu_args))
                on = run(lambda: call(op, pair.neuron_args))
            compared = attempt("forward", lambda: compare_outcomes(on, oc, "forward", metadata_only, pair.cpu_ok),
                               desc)
            if compared and not metadata_only:
                attempt("backward", lambda: check_backward(op, pair, on.value, oc.value, i), desc)

        if i < HIGHER_ORDER_SAMPLES and not metadata_only:
            attempt("gradgrad", lambda: check_gradgrad(op, pair, i), desc)
            attempt("fwad", lambda: check_fwad(op, pair, i), desc)

        # in-place variant: result and mutated self
        if isinstance(sample.input, torch.Tensor):
            attempt("inplace", lambda: check_inplace(op, pair, metadata_only), desc)

        # out= variant: by turns, empty outs (to be resized), correctly shaped ones, noncontiguous ones
        attempt("out", lambda: check_out(op, pair, kind=("resize", "sized", "noncontiguous")[i % 3],
                                         metadata_only=metadata_only, device=device), desc)

        # the first sample again on neuron:1: results stay on the device of the inputs
        if i == 0:
            attempt("device1", lambda: check_device1(op, pair, metadata_only), desc)

    for a in active:
        if res[a].status == "pass" and res[a].samples == 0:
            res[a].status = "n/a"
            res[a].reason = "no sample exercised it (every sample raised on both devices, or none applies)"
    result.aspects = res
    result.seconds = time.perf_counter() - t0
    return result


def check_inplace(op, pair, metadata_only):
    n_args, c_args = pair.detached(clone_input=True)
    with torch.no_grad():
        oc = run(lambda: call(op.inplace_variant, c_args))
        on = run(lambda: call(op.inplace_variant, n_args))
    if not compare_outcomes(on, oc, "in-place result", metadata_only, pair.cpu_ok):
        return False
    compare_values(n_args[0], c_args[0], "in-place self", metadata_only, pair.cpu_ok)
    if isinstance(on.value, torch.Tensor) and on.value is not n_args[0]:
        raise Mismatch("in-place: the in-place variant did not return self")
    return True


def _fill_value(dtype):
    return True if dtype == torch.bool else 3


def check_out(op, pair, kind, metadata_only, device):
    n_args, c_args = pair.detached()
    # learn the result's structure on clones: some ops also update arguments (batch norm's running stats)
    scratch = map_structure(c_args, lambda t: t.clone(), lambda d: d)
    with torch.no_grad():
        ref = run(lambda: call(op, scratch))
    if ref.error is not None:
        return False
    flat, _ = tree_flatten(ref.value)
    if not flat or not all(isinstance(t, torch.Tensor) for t in flat):
        return False

    def outs(dev):
        # same initial contents on both sides (some CPU kernels read their out= tensor)
        made = []
        for t in flat:
            if kind == "resize":
                made.append(torch.empty(0, dtype=t.dtype, device=dev))
                continue
            full = torch.full(t.shape, _fill_value(t.dtype), dtype=t.dtype, device=dev)
            made.append(noncontiguous_like(full) if kind == "noncontiguous" else full)
        return made[0] if isinstance(ref.value, torch.Tensor) else tuple(made)
    out_c, out_n = outs("cpu"), outs(device)
    with torch.no_grad():
        oc = run(lambda: call(op, c_args, out=out_c))
        on = run(lambda: call(op, n_args, out=out_n))
    if not compare_outcomes(on, oc, "out= result", metadata_only, pair.cpu_ok):
        return False
    compare_values(out_n, out_c, "out= tensors", metadata_only, pair.cpu_ok)
    for r, o in zip(tree_flatten(on.value)[0], tree_flatten(out_n)[0]):
        if isinstance(r, torch.Tensor) and r.data_ptr() != o.data_ptr():
            raise Mismatch("out=: the returned tensor is not the out= tensor")
    for a, e in zip(tree_flatten(out_n)[0], tree_flatten(out_c)[0]):
        if a.numel() > 1 and a.stride() != e.stride():
            raise Mismatch(f"out=: out tensor strides {a.stride()} on neuron, {e.stride()} on the CPU ({kind} out)")
    return True


def check_device1(op, pair, metadata_only):
    if torch.neuron.device_count() < 2:
        return False
    dev1 = torch.device("neuron:1")
    n_args, c_args = pair.detached()
    args1 = map_structure(n_args, lambda t: copy_tensor(t, dev1) if t.device.type == "neuron" else t,
                          lambda d: dev1)
    with torch.no_grad():
        oc = run(lambda: call(op, c_args))
        o1 = run(lambda: call(op, args1))  # the current device stays neuron:0
    if not compare_outcomes(o1, oc, "neuron:1 forward", metadata_only, pair.cpu_ok):
        return False
    for t in tree_flatten(o1.value)[0]:
        if isinstance(t, torch.Tensor) and t.device.type == "neuron" and t.device != dev1:
            raise Mismatch(f"neuron:1 forward: result on {t.device}, expected neuron:1")
    return True
