"""Counting the work of a program: one record per kernel, grouped by step.

:class:`CountingMode` is a ``TorchDispatchMode``: every ATen op that reaches the
dispatcher while it is active is recorded with its class (matmul, elementwise,
transcendental, reduction, gather/scatter, sort, copy, collective), its FLOPs, the
bytes it reads and writes (from tensor metadata alone, so fake and meta tensors
count like real ones), and its dtype. Matmul, convolution and attention FLOPs
come from PyTorch's own formulas (``torch.utils.flop_counter.flop_registry``).

Counting never needs the values: under :func:`fake_mode` the program runs on
PyTorch's fake tensors, nothing is computed or allocated, and a model far larger
than this machine can be counted at its real batch and sequence length. What fake
mode cannot do is follow data-dependent shapes (``nonzero``, ``masked_select``,
``unique``, boolean indexing): those ops raise, and the run stops there.

An op registered with ``torchneuron.nki.nki_op`` is one record, which also carries what the
NKI kernels it ran take on each NeuronCore generation by their own estimate
(:class:`KernelEstimates`); its kernels' instructions depend on shapes alone, so fake runs
record them too.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from torchneuron import _C, nki

from ._step_signatures import _KernelWatch, _resolve_steps

logger = logging.getLogger("torchneuron")

aten = torch.ops.aten

_SWEEP_EVERY = 8  # ops between sweeps of released storage; the peak may overstate by that many ops' outputs

# Op classes, each the engine family that would run it (see model.py).
MATMUL = "matmul"
ELEMENTWISE = "elementwise"
TRANSCENDENTAL = "transcendental"
REDUCTION = "reduction"
GATHER_SCATTER = "gather_scatter"
SORT = "sort"
COPY = "copy"
COLLECTIVE = "collective"
CLASSES = (MATMUL, ELEMENTWISE, TRANSCENDENTAL, REDUCTION, GATHER_SCATTER, SORT, COPY, COLLECTIVE)

# Ops whose per-element cost is a transcendental function (exp, log, sin, erf...),
# run by an activation/scalar engine rather than an ALU; FLOPs = numel of output.
_TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "sigmoid",
    "erf", "erfc", "erfinv", "rsqrt", "sqrt", "pow", "gelu", "silu", "mish", "softplus", "elu",
    "selu", "celu", "logit", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh",
    "atanh", "lgamma", "digamma", "reciprocal", "gelu_backward", "silu_backward", "tanh_backward",
    "sigmoid_backward", "_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "softplus_backward", "elu_backward", "mish_backward",
}
# Ops that reduce over one or more dimensions; FLOPs = numel of the input.
_REDUCTION = {
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "std_mean",
    "norm", "linalg_vector_norm", "logsumexp", "cumsum", "cumprod", "argmax", "argmin", "all", "any",
    "native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "native_group_norm", "native_group_norm_backward",
    "_fused_rms_norm", "_fused_rms_norm_backward", "nll_loss_forward", "nll_loss_backward",
    "nll_loss2d_forward", "nll_loss2d_backward", "max_pool2d_with_indices", "avg_pool2d",
    "max_pool2d_with_indices_backward", "avg_pool2d_backward", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "adaptive_max_pool2d", "count_nonzero", "_foreach_norm",
}
# Indexed reads and writes: FLOPs 0, cost is memory traffic on a DMA/GPSIMD path.
_GATHER_SCATTER = {
    "embedding", "embedding_dense_backward", "index_select", "index", "index_put", "index_put_",
    "_index_put_impl_", "index_add", "index_add_", "gather", "scatter", "scatter_", "scatter_add",
    "scatter_add_", "scatter_reduce", "scatter_reduce_", "take", "put_", "masked_select",
    "masked_scatter", "masked_scatter_", "_unsafe_index", "_unsafe_index_put", "index_copy",
    "index_copy_", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only",
}
# Sorting and selection: FLOPs n·log2(n) compares per sorted row.
_SORT = {"sort", "argsort", "topk", "kthvalue", "median", "nanmedian", "msort", "unique", "_unique2",
         "unique_consecutive", "unique_dim"}
# Data movement without arithmetic.
_COPY = {"copy_", "_to_copy", "clone", "contiguous", "cat", "stack", "_copy_from", "constant_pad_nd",
         "fill_", "zero_", "zeros_like", "ones_like", "full_like", "empty_like", "repeat", "flip", "roll",
         "tril", "triu", "where", "masked_fill", "masked_fill_", "split_with_sizes_copy", "new_zeros",
         "new_ones", "new_full", "_foreach_copy_", "_foreach_zero_", "lift_fresh_copy", "slice_scatter",
         "select_scatter", "diagonal_scatter", "as_strided_scatter", "native_dropout"}
# Ops that create memory (factories) or only change metadata: no kernel time, no traffic read.
_FREE = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "alias",
         "lift_fresh", "_local_scalar_dense", "set_", "resize_", "is_same_size", "_unsafe_view",
         "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_has_compatible_shallow_copy_type",
         "record_stream", "_assert_async", "_assert_tensor_metadata", "_functional_sym_constrain_range",
         "_pin_memory", "is_pinned"}  # pinning is the host's work, no device kernel
_COLLECTIVE_NAMES = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "broadcast_": "broadcast", "broadcast": "broadcast", "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all", "send": "send", "recv_": "recv",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "allreduce_coalesced_": "all_reduce",
}

# Where fused eager ends a group of recorded ops: its policy's cut rules (csrc/fused/policy.h, read
# through torchneuron._C._fused_policy(); docs/fused_eager.md, "Where a group is cut"). A value read
# back to the host ends the group before the next op; the other causes are ops fused eager cannot
# record, which run by themselves, op by op, between two groups.
_CUT_RULES = {rule["key"]: rule for rule in _C._fused_policy().cuts}
CUT_HOST_READ = _CUT_RULES["host_read"]["name"]
CUT_HOST_COPY = _CUT_RULES["host_copy"]["name"]
CUT_RANDOM = _CUT_RULES["random"]["name"]
CUT_DATA_DEPENDENT = _CUT_RULES["data_dependent"]["name"]
CUT_COLLECTIVE = _CUT_RULES["collective"]["name"]
RUNS_ALONE = tuple(rule["name"] for rule in _CUT_RULES.values() if rule["runs_alone"])
_HOST_COPIES = frozenset(_CUT_RULES["host_copy"]["ops"])  # a cut when its tensors are on the host and the device
# The rules an op's tags mark it for, in the policy's order (the first that applies is its cut).
_TAG_CUTS = tuple((getattr(torch.Tag, tag), rule["name"]) for rule in _CUT_RULES.values() for tag in rule["tags"])

# Attention kernels PyTorch's registry does not list (the CPU flash kernel the neuron device runs):
# counted like the registry's flash-attention formulas, 2 matmuls forward and 5 backward.
_EXTRA_FLOPS = {}
for _name, _matmuls in (("_scaled_dot_product_flash_attention_for_cpu", 2),
                        ("_scaled_dot_product_flash_attention_for_cpu_backward", 5)):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        _EXTRA_FLOPS[_packet] = _matmuls


@dataclass
class OpRecord:
    """The work of one kernel (or of several identical calls, with ``count``).

    Args:
        name: ATen op name, e.g. ``aten.mm.default``.
        cls: one of :data:`CLASSES`.
        flops: floating-point operations (a multiply-add counts 2).
        bytes_read: bytes of every tensor argument.
        bytes_written: bytes of every tensor result.
        dtype: dtype of the widest floating input (or of the output).
        count: calls folded into this record.
        collective: for collectives, ``all_reduce``, ``all_gather``...
        group_size: for collectives, ranks in the process group (0 if unknown).
        phase: ``"model"`` (forward and backward) or ``"optimizer"`` (inside ``Optimizer.step``).
        inputs, outputs: ``(storage identity, bytes)`` of each tensor read and written, so that a
            fused kernel can tell the tensors its own ops produce from those it reads from memory.
        cut: why fused eager would end its group before this op (one of the ``CUT_*`` names), or
            ``""``; for the causes in :data:`RUNS_ALONE` the op also runs by itself, op by op.
    """

    name: str
    cls: str
    flops: float
    bytes_read: int
    bytes_written: int
    dtype: str
    count: int = 1
    collective: str = ""
    group_size: int = 0
    phase: str = "model"
    inputs: tuple = ()
    outputs: tuple = ()
    cut: str = ""
    nki: Optional["KernelEstimates"] = None


@dataclass(frozen=True)
class KernelEstimates:
    """The NKI kernels an op ran (an op registered with ``torchneuron.nki.nki_op``) and what they take
    on one NeuronCore of each generation by their own estimate: ``Kernel.estimate``'s cost model on
    the instructions the calls recorded, which depend on shapes alone (fake tensors record them too).

    Args:
        kernels: the kernels' names, in call order.
        seconds: per generation (``"trn1"``, ``"trn2"``, ``"trn3"``), the calls' estimates one after another.
        engine_seconds: per generation, each engine's busy time over the calls.
    """

    kernels: Tuple[str, ...]
    seconds: Dict[str, float]
    engine_seconds: Dict[str, Dict[str, float]]

    @classmethod
    def of(cls, calls: List[Any]) -> "KernelEstimates":
        """From the ``nki.KernelCall`` records of one op's call."""
        seconds: Dict[str, float] = {}
        engines: Dict[str, Dict[str, float]] = {}
        for target in nki.TARGETS:
            seconds[target] = 0.0
            busy = engines[target] = {}
            for call in calls:
                estimate = call.estimate(target)
                seconds[target] += estimate.seconds
                for engine, s in estimate.engine_seconds.items():
                    busy[engine] = busy.get(engine, 0.0) + s
        return cls(tuple(c.name for c in calls), seconds, engines)

    def bound(self, target: str) -> str:
        """The engine busiest over the calls on ``target``."""
        busy = self.engine_seconds[target]
        return max(busy, key=busy.get) if busy else "-"


@dataclass
class StepCounts:
    """Everything one step did: its op records and what it processed."""

    ops: List[OpRecord] = field(default_factory=list)
    tokens: int = 0
    samples: int = 0
    audio_s: float = 0.0
    start_bytes: int = 0
    peak_bytes: int = 0
    forward_peak_bytes: int = 0
    counted: bool = True
    repeat_of: int = -1
    segment: int = -1

    def total(self, attr: str = "flops", cls: Optional[str] = None) -> float:
        """Sum ``attr`` (``flops``, ``bytes_read``, ``bytes_written``) over ops, optionally of one class."""
        return sum(getattr(op, attr) for op in self.ops if cls is None or op.cls == cls)

    def by_class(self) -> Dict[str, Dict[str, float]]:
        """Totals per op class: calls, flops, bytes."""
        out: Dict[str, Dict[str, float]] = {}
        for op in self.ops:
            row = out.setdefault(op.cls, {"calls": 0, "flops": 0.0, "bytes": 0})
            row["calls"] += op.count
            row["flops"] += op.flops
            row["bytes"] += op.bytes_read + op.bytes_written
        return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(tree: Any) -> List[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _classify(base: str, func: Any) -> str:
    if func.overloadpacket in flop_registry or func.overloadpacket in _EXTRA_FLOPS:
        return MATMUL
    if base in _COLLECTIVE_NAMES and func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
        return COLLECTIVE
    stripped = base.rstrip("_")
    for name in (base, stripped, stripped.replace("_foreach_", "")):
        if name in _TRANSCENDENTAL:
            return TRANSCENDENTAL
        if name in _REDUCTION:
            return REDUCTION
        if name in _GATHER_SCATTER:
            return GATHER_SCATTER
        if name in _SORT:
            return SORT
    if base in _COPY or stripped in _COPY:
        return COPY
    return ELEMENTWISE


def _is_free(func: Any, base: str) -> bool:
    if base in _FREE:
        return True
    try:
        return bool(func.is_view)
    except AttributeError:
        return False


def _dtype_of(inputs: List[torch.Tensor], outputs: List[torch.Tensor]) -> torch.dtype:
    for t in inputs + outputs:
        if t.is_floating_point():
            return t.dtype
    for t in outputs + inputs:
        return t.dtype
    return torch.float32


def _sdpa_cpu_flops(func: Any, args: tuple) -> float:
    # Forward args: (q, k, v, ...); backward args: (grad_out, q, k, v, ...).
    matmuls = _EXTRA_FLOPS[func.overloadpacket]
    q, k, v = args[:3] if matmuls == 2 else args[1:4]
    *batch, lq, d = q.shape
    lk = k.shape[-2]
    b = 1
    for x in batch:
        b *= x
    return 2.0 * b * lq * lk * d * matmuls


class _LiveMemory:
    """The memory a counted program holds: the bytes of the storages its ops created that are still
    alive, their peak, and a number naming each storage the ops read or write.

    Outputs of non-view, out-of-place ops own new storage. Its release is seen through a weak
    reference to the storage, swept every few ops (tensors themselves carry nothing).
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: List[Any] = []
        self._ops_since_sweep = 0
        self._idents: Dict[int, Any] = {}
        self._serial = 0

    def track(self, outputs: List[torch.Tensor], step: StepCounts, forward: bool) -> None:
        """Count ``outputs``' storage as live in ``step``, and in its forward peak if ``forward``."""
        for t in outputs:
            try:
                ref = StorageWeakRef(t.untyped_storage())
            except Exception:  # tensors without a storage (sparse, nested) are not tracked
                continue
            size = _nbytes(t)
            self._live.append((ref, size))
            self.live_bytes += size
        self._ops_since_sweep += 1
        # A new peak is only believed after releases are swept (at most every few ops).
        if self.live_bytes > step.peak_bytes and self._ops_since_sweep >= _SWEEP_EVERY:
            self.sweep()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        step.peak_bytes = max(step.peak_bytes, self.live_bytes)
        if forward:
            # Outside backward and the optimizer: what the forward keeps alive (activations).
            step.forward_peak_bytes = max(step.forward_peak_bytes, self.live_bytes)

    def ident(self, t: torch.Tensor) -> int:
        """A number naming ``t``'s storage for as long as it lives (views share it; a storage
        allocated later at the same address gets a new number)."""
        try:
            storage = t.untyped_storage()
        except Exception:  # no storage (sparse, nested): the tensor object names itself
            return -id(t)
        key = storage._cdata
        entry = self._idents.get(key)
        if entry is None or entry[0].expired():
            self._serial += 1
            entry = (StorageWeakRef(storage), self._serial)
            self._idents[key] = entry
        return entry[1]

    def sweep(self) -> None:
        """Forget the storages released since the last sweep."""
        self._ops_since_sweep = 0
        if len(self._idents) > 4 * len(self._live) + 1024:
            self._idents = {k: v for k, v in self._idents.items() if not v[0].expired()}
        alive = []
        for ref, size in self._live:
            if ref.expired():
                self.live_bytes -= size
            else:
                alive.append((ref, size))
        self._live = alive


class CountingMode(TorchDispatchMode):
    """Record the work of every ATen op run while active, step by step.

    Args:
        group_size: ranks assumed for collectives whose process group cannot be read (default 1).
        auto_steps: each ``Optimizer.step`` closes a step until :meth:`mark_step` is first called.
        full_steps: count this many steps op by op, then only watch the steps that follow through
            PyTorch's profiler (kernel names, input shapes and dtypes, recorded in C++) and, when
            counting ends, give each the records of the fully counted step whose kernels it repeats
            exactly (:meth:`resolve`). ``None``: every step is counted op by op.

    Example::

        with CountingMode() as counter:
            loss = model(x).sum(); loss.backward()
            counter.mark_step(tokens=x.numel())
        print(counter.steps[0].total("flops"))
    """

    def __init__(self, group_size: int = 1, auto_steps: bool = True, full_steps: Optional[int] = None) -> None:
        super().__init__()
        self.full_steps = full_steps
        self.unmatched_steps = 0
        self._dispatching = False
        self._watch: Optional[_KernelWatch] = None
        self._segment = 0
        self._switched = False
        self.group_size = group_size
        self.auto_steps = auto_steps
        self.marked = False
        self.params = 0
        self.param_bytes = 0
        self.steps: List[StepCounts] = [StepCounts()]
        self.data_dependent_reads = 0
        self.saw_fake = False
        self._phase = "model"
        self._hooks: List[Any] = []
        self._memory = _LiveMemory()
        self._pending_cut = ""  # a value was read back since the last recorded op

    def __enter__(self) -> "CountingMode":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre(optimizer: Any, *_: Any) -> None:
            self._phase = "optimizer"
            params = [p for g in optimizer.param_groups for p in g["params"]]
            self.params = sum(p.numel() for p in params)
            self.param_bytes = params[0].element_size() if params else 0

        def post(*_: Any) -> None:
            self._phase = "model"
            if self.auto_steps and not self.marked:
                self._close_step()

        self._hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        if self.full_steps is not None:
            self._watch = _KernelWatch(frozenset(_FREE))
            self._watch.start()
        self._dispatching = True
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._dispatching:
            self._dispatching = False
            super().__exit__(*exc)
        if self._watch is not None:
            watch, self._watch = self._watch, None
            self.resolve(watch.stop())

    def _stop_dispatch(self) -> None:
        """Stop counting op by op (the steps that follow are watched through the profiler)."""
        if self._dispatching:
            self._dispatching = False
            super().__exit__(None, None, None)

    def resolve(self, signatures: Dict[str, Dict[int, Any]]) -> None:
        """Give each watched step the records of the fully counted step whose kernels it repeats
        (:func:`_resolve_steps`; ``signatures`` from :meth:`_KernelWatch.stop`)."""
        self.unmatched_steps += _resolve_steps(self.steps, signatures)

    # -- steps ---------------------------------------------------------------------------------
    @property
    def current(self) -> StepCounts:
        """The step being recorded."""
        return self.steps[-1]

    def mark_step(self, tokens: int = 0, samples: int = 0, audio_s: float = 0.0) -> None:
        """Close the current step, crediting it with ``tokens``, ``samples`` and ``audio_s`` seconds
        of audio; open the next.

        Until the first call, each ``Optimizer.step`` closes a step by itself (``auto_steps``).
        """
        if not self.marked and self.auto_steps and not self.current.ops and len(self.steps) > 1:
            # An optimizer step already closed this step: credit it instead of opening an empty one.
            self.marked = True
            self.steps.pop()
        self.marked = True
        self._close_step(tokens, samples)
        self.steps[-2].audio_s += audio_s
        if self._watch is not None and not self._dispatching and not self._switched and len(self.steps) > 2:
            # Only here, where the program marks a step itself: a profiler session must not end
            # inside a profiled scope, as it would inside Optimizer.step's hooks. And only once two
            # watched steps in a row allocated alike (the program is in its steady state).
            closed, before = self.steps[-2], self.steps[-3]
            if not closed.counted and not before.counted and before.segment >= 0 and closed.segment >= 0:
                if self._watch.allocated(closed.segment) == self._watch.allocated(before.segment):
                    self._switched = self._watch.switch(closed.segment)

    def _close_step(self, tokens: int = 0, samples: int = 0) -> None:
        self._memory.sweep()
        self.current.tokens += tokens
        self.current.samples += samples
        self._boundary(self.current)
        self.steps.append(StepCounts(start_bytes=self.live_bytes, peak_bytes=self.live_bytes,
                                     forward_peak_bytes=self.live_bytes, counted=self._dispatching))
        if self.full_steps is not None and self._dispatching and sum(s.counted for s in self.steps[:-1]) >= self.full_steps:
            self._stop_dispatch()
            self.steps[-1].counted = False

    def _boundary(self, step: Optional[StepCounts]) -> None:
        # The ops of the profiler's timeline between two boundaries form one segment.
        if step is not None and step.segment < 0:
            step.segment = self._segment
        if self._watch is not None:
            self._watch.boundary()
            self._segment += 1

    def discard(self) -> None:
        """Forget the ops of the open step (model construction, warm-up) without closing it."""
        self._memory.sweep()
        self._boundary(None)
        self.steps[-1] = StepCounts(start_bytes=self.live_bytes, peak_bytes=self.live_bytes,
                                    forward_peak_bytes=self.live_bytes, counted=self.steps[-1].counted)

    def completed_steps(self) -> List[StepCounts]:
        """Steps closed by :meth:`mark_step` whose work is known, or the open one if none was closed."""
        done = [s for s in self.steps[:-1] if s.counted]
        if not self.steps[:-1] and self.steps[-1].ops:
            return [self.steps[-1]]
        return done

    # -- memory ----------------------------------------------------------------------------------
    @property
    def live_bytes(self) -> int:
        """Bytes of the storages created by counted ops that are still alive."""
        return self._memory.live_bytes

    @property
    def peak_bytes(self) -> int:
        """The most :attr:`live_bytes` has been since counting began."""
        return self._memory.peak_bytes

    # -- dispatch --------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        info = _OP_INFO.get(func)
        if info is None:
            info = _OP_INFO[func] = _op_info(func)
        base, cls, free, inplace, _, runs_nki = info
        if base == "_local_scalar_dense":
            if args[0].device.type != "cpu":  # a CPU scalar (an optimizer's step count) is no device read
                self._pending_cut = CUT_HOST_READ
            if _is_fake_or_meta(args[0]):
                # A value read back to Python (loss.item()) has no value without data; fake mode reads 1.
                self.data_dependent_reads += 1
                return 1 if not args[0].is_floating_point() else 1.0
        if base == "_pin_memory" and _is_fake_or_meta(args[0]):
            # Pinned host memory (a DataLoader's pin_memory=True, the Trainer's default) only speeds up
            # copies; fake tensors have no pinned form, so the batch stays as it is.
            return args[0]
        if runs_nki:  # its kernels' instructions, for their estimate on each NeuronCore generation
            with nki.record_calls() as calls:
                out = func(*args, **kwargs) if kwargs else func(*args)
        else:
            out = func(*args, **kwargs) if kwargs else func(*args)
        if free:
            return out
        inputs, outputs = _operands(args, kwargs, out, inplace)
        if not self.saw_fake and (outputs or inputs) and _is_fake_or_meta((outputs or inputs)[0]):
            self.saw_fake = True
        record, fresh = _op_record(func, info, args, kwargs, out, inputs, outputs, self._memory.ident)
        record.phase = self._phase
        if cls == COLLECTIVE:
            record.group_size = record.group_size or self.group_size
        if runs_nki:
            record.nki = KernelEstimates.of(calls)
        cut = record.cut  # the op's own; a value read back before it also ends the group there
        record.cut = cut or self._pending_cut
        self._pending_cut = CUT_HOST_READ if cut == CUT_HOST_READ else ""
        self.current.ops.append(record)
        forward = self._phase == "model" and torch._C._current_graph_task_id() == -1
        self._memory.track(fresh, self.current, forward)
        return out


# Per-op facts that do not change between calls: (base name, class, free, in-place, fused eager's cut kind,
# whether it runs NKI kernels).
_OP_INFO: Dict[Any, tuple] = {}
_DROPOUT_ARG: Dict[Any, int] = {}  # random ops that draw only with a dropout probability: its position
_OP_NAMES: Dict[Any, str] = {}
_DTYPE_NAMES = {d: str(d).replace("torch.", "") for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.bool, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2)}


class _DtypeNames(dict):
    def __missing__(self, key: Any) -> str:
        name = self[key] = str(key).replace("torch.", "")
        return name


_DTYPE_NAMES = _DtypeNames(_DTYPE_NAMES)


def _op_name(func: Any) -> str:
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = str(func)
    return name


def _op_info(func: Any) -> tuple:
    base = func.overloadpacket.__name__
    free = func.namespace in ("profiler", "prim") or _is_free(func, base)
    cls = _classify(base, func)
    tags = getattr(func, "tags", ())
    cut = CUT_COLLECTIVE if cls == COLLECTIVE else next((name for tag, name in _TAG_CUTS if tag in tags), "")
    if cut == CUT_RANDOM:
        names = [a.name for a in func._schema.arguments]
        if "dropout_p" in names:
            _DROPOUT_ARG[func] = names.index("dropout_p")
    return base, cls, free, base.endswith("_"), cut, nki.is_nki_op(func)


def _operands(args: tuple, kwargs: Any, out: Any, inplace: bool) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The tensors an op call reads and those it writes."""
    inputs = _flat_tensors(args)
    if kwargs:
        inputs += _flat_tensors(kwargs.values())
    outputs = [out] if isinstance(out, torch.Tensor) else _flat_tensors(out) if isinstance(out, (tuple, list)) else []
    if inplace and not outputs:
        # In-place: the first argument (the first list, for _foreach_ ops) is what is written.
        outputs = _flat_tensors(args[:1]) if args else inputs[:1]
    return inputs, outputs


def _op_record(func: Any, info: tuple, args: tuple, kwargs: Any, out: Any, inputs: List[torch.Tensor],
               outputs: List[torch.Tensor], ident: Any) -> Tuple[OpRecord, List[torch.Tensor]]:
    """The record of one op call, with the cut the op makes by itself, and the outputs that own new
    storage. ``ident`` names a tensor's storage; the caller adds what depends on the counting (the
    phase, a collective's group size when the call does not say it, a cut carried from before)."""
    base, cls, _, inplace, cut, _ = info
    in_sizes = [t.numel() * t.element_size() for t in inputs]
    out_sizes = [t.numel() * t.element_size() for t in outputs]
    flops = 0.0
    if cls == MATMUL:
        if func.overloadpacket in flop_registry:
            flops = float(flop_registry[func.overloadpacket](*args, **(kwargs or {}), out_val=out))
        else:
            flops = _sdpa_cpu_flops(func, args)
    elif cls in (ELEMENTWISE, TRANSCENDENTAL):
        flops = float(sum(t.numel() for t in outputs)) if outputs else float(sum(t.numel() for t in inputs))
    elif cls == REDUCTION:
        flops = float(sum(t.numel() for t in inputs))
    elif cls == SORT and inputs:
        n = inputs[0].shape[-1] if inputs[0].dim() else 1
        flops = float(inputs[0].numel()) * max(1.0, float(int(n).bit_length()))
    ids = {id(t) for t in inputs}
    fresh = [t for t in outputs if id(t) not in ids]
    bytes_written = sum(out_sizes) if inplace else sum(t.numel() * t.element_size() for t in fresh)
    dtype = _DTYPE_NAMES[_dtype_of(inputs, outputs)]
    record = OpRecord(_op_name(func), cls, flops,
                      sum(in_sizes), bytes_written, dtype,
                      inputs=tuple(zip(map(ident, inputs), in_sizes)),
                      outputs=tuple(zip(map(ident, outputs), out_sizes)))
    if cls == COLLECTIVE:
        record.collective = _COLLECTIVE_NAMES.get(base, base)
        record.group_size = _group_size(args)
    if cut == CUT_RANDOM and (drop_at := _DROPOUT_ARG.get(func)) is not None:
        # Attention with dropout_p == 0 draws nothing: fused eager records it like any op.
        p_drop = args[drop_at] if len(args) > drop_at else (kwargs or {}).get("dropout_p", 0.0)
        cut = CUT_RANDOM if p_drop else ""
    elif cut == CUT_DATA_DEPENDENT and base in ("index", "_unsafe_index"):
        # Integer indices have sizes known ahead; only a boolean mask's result depends on the data.
        cut = CUT_DATA_DEPENDENT if any(t.dtype in (torch.bool, torch.uint8) for t in inputs[1:]) else ""
    elif base in _HOST_COPIES and len({t.device.type for t in inputs + outputs}) > 1:
        cut = CUT_HOST_COPY
    record.cut = cut
    return record, fresh


def _flat_tensors(items: Any) -> List[torch.Tensor]:
    """Tensors among ``items`` and inside their lists and tuples (one level of nesting, as ATen
    signatures have: ``Tensor[]`` and ``Tensor?[]``)."""
    out = []
    for a in items:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _is_fake_or_meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_meta or _is_fake(t))


def _group_size(args: tuple) -> int:
    for a in tree_flatten(args)[0]:
        if isinstance(a, torch.ScriptObject):
            try:
                return int(a.size())
            except Exception:
                continue
        if isinstance(a, int) and not isinstance(a, bool) and a > 1:
            return a
    return 0


@contextlib.contextmanager
def fake_mode() -> Iterator[Any]:
    """Run a block on fake tensors: shapes, dtypes and devices only, nothing computed or allocated.

    Tensors created inside are fake on whatever device the code asks for ("neuron" included);
    real tensors created before may be passed in. Data-dependent shapes raise
    ``torch._subclasses.fake_tensor.DynamicOutputShapeException``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def summarize(steps: List[StepCounts]) -> Dict[str, Any]:
    """Average work per step over ``steps``: totals, per class, per dtype."""
    if not steps:
        return {"steps": 0}
    per_class: Dict[str, Dict[str, float]] = defaultdict(lambda: {"calls": 0, "flops": 0.0, "bytes": 0})
    for s in steps:
        for cls, row in s.by_class().items():
            for k, v in row.items():
                per_class[cls][k] += v / len(steps)
    return {
        "steps": len(steps),
        "flops": sum(s.total("flops") for s in steps) / len(steps),
        "bytes": sum(s.total("bytes_read") + s.total("bytes_written") for s in steps) / len(steps),
        "ops": sum(len(s.ops) for s in steps) / len(steps),
        "tokens": sum(s.tokens for s in steps) / len(steps),
        "samples": sum(s.samples for s in steps) / len(steps),
        "audio_s": sum(s.audio_s for s in steps) / len(steps),
        "peak_bytes": max(s.peak_bytes for s in steps),
        "activation_bytes": max(s.forward_peak_bytes - s.start_bytes for s in steps),
        "by_class": dict(per_class),
    }
