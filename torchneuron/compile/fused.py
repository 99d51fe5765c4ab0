"""Fused eager's graph compiler: a recorded group of ops becomes one graph, compiled by the same
Inductor pipeline as ``torch.compile(backend="neuron")``.

The C++ core records ops on neuron tensors (``csrc/fused/fused.cpp``) and, once a group has been
seen often enough, hands it here: its ops in order, their arguments and results as meta tensors,
and its storages. The graph is written in the ops' own terms, in-place ops and ``out=`` included:

* each storage the group reads from before it, or that it made and something still refers to, is
  a flat input tensor (the compiled graph writes the second kind, and whatever it changes of the
  first: AOTAutograd's functionalization turns the writes into its input mutations);
* a storage the group made that nothing refers to any more is a value inside the graph, which
  Inductor fuses away;
* a tensor argument is its producer's result when it has the same sizes, strides and offset, else
  ``as_strided`` over its storage.

:func:`compile_group` returns the callable the core runs the group with: ``run(inputs)``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import operator
import os
import tempfile
import threading
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from .. import _C

__all__ = ["FusedGroup", "FusedReport", "build_graph", "compile_group", "expect", "fused_report", "learned"]

log = logging.getLogger("torchneuron")
aten = torch.ops.aten


class _Builder:
    """Writes one recorded group as an FX graph."""

    def __init__(self, storages: Sequence[tuple[torch.Tensor, bool, bool]], device: torch.device,
                 floats: Sequence[tuple[float, bool]]) -> None:
        self.graph = fx.Graph()
        self.lift = True  # the current op's floats are inputs
        self.device = device
        self.index = {flat.untyped_storage()._cdata: i for i, (flat, _, _) in enumerate(storages)}
        self.flat = [flat for flat, _, _ in storages]
        self.made = [made for _, made, _ in storages]
        self.placeholders: dict[int, fx.Node] = {}
        self.base: dict[int, fx.Node] = {}  # storage -> its current flat value
        self.exact: dict[tuple, fx.Node] = {}  # (storage, sizes, strides, offset) -> a node of that layout
        self.made_by: dict[int, int] = {}  # storage -> the op that made it
        for i, (_, made, is_input) in enumerate(storages):
            if is_input:
                self.placeholders[i] = self.graph.placeholder(f"storage{i}")
                if not made:
                    self.base[i] = self.placeholders[i]
        # Floats (a learning rate, a bias correction) are inputs: 0-dim float64 CPU tensors, read in the graph.
        self.floats: list[Any] = [self.graph.placeholder(f"float{k}") if lifted else value
                                  for k, (value, lifted) in enumerate(floats)]
        self.next_float = 0

    def call(self, target: Callable, *args: Any, **kwargs: Any) -> fx.Node:
        return self.graph.call_function(target, args, kwargs)

    def storage(self, t: torch.Tensor) -> int:
        return self.index[t.untyped_storage()._cdata]

    @staticmethod
    def layout(i: int, t: torch.Tensor) -> tuple:
        return (i, tuple(t.shape), tuple(t.stride()), t.storage_offset())

    def read(self, t: torch.Tensor) -> fx.Node:
        if t.device.type != "meta":  # a CPU scalar tensor
            return self.call(aten.scalar_tensor.default, t.item(), dtype=t.dtype)
        i = self.storage(t)
        key = self.layout(i, t)
        node = self.exact.get(key)
        if node is None:
            node = self.call(aten.as_strided.default, self.base[i], list(t.shape), list(t.stride()), t.storage_offset())
            self.exact[key] = node
        return node

    def value(self, v: Any, scalar: bool = False) -> Any:
        if isinstance(v, torch.Tensor):
            return self.read(v)
        if isinstance(v, float) and self.lift and scalar:
            f = self.floats[self.next_float]
            self.next_float += 1
            return self.call(aten._local_scalar_dense.default, f) if isinstance(f, fx.Node) else f
        if isinstance(v, (list, tuple)):
            return [self.value(e, scalar) for e in v]
        if isinstance(v, torch.device) and v.type == "meta":
            return self.device
        return v

    def result(self, op_index: int, r: torch.Tensor, node: fx.Node) -> None:
        i = self.storage(r)
        key = self.layout(i, r)
        n = self.flat[i].numel()
        if self.made[i] and i not in self.base:  # the op made this storage
            self.made_by[i] = op_index
            covers = (r.storage_offset() == 0 and r.numel() == n and is_non_overlapping_and_dense(r))
            if covers:
                # The result itself stands for its storage (as_strided is relative to the storage): a
                # view of it would make a write through as_strided a chain of two views, which
                # functionalization refuses.
                self.base[i] = node
            else:
                empty = self.call(aten.empty.memory_format, [n], dtype=self.flat[i].dtype, device=self.device)
                self.base[i] = self.call(aten.as_strided_scatter.default, empty, node, list(r.shape),
                                         list(r.stride()), r.storage_offset())
                return
            self.exact[key] = node
        elif self.made[i] and self.made_by.get(i) == op_index:  # another result on the buffer the op made
            self.base[i] = self.call(aten.as_strided_scatter.default, self.base[i], node, list(r.shape),
                                     list(r.stride()), r.storage_offset())
            self.exact = {k: v for k, v in self.exact.items() if k[0] != i}
        else:  # in place, or a view of an argument
            self.exact.setdefault(key, node)

    def op(self, op_index: int, name: str, overload: str, args: list, results: list, lift: bool) -> None:
        self.lift = lift
        packet = getattr(aten, name.split("::", 1)[1])
        target = getattr(packet, overload or "default")
        schema = target._schema
        positional, kwargs = [], {}
        for a, v in zip(schema.arguments, args):
            v = self.value(v, _is_scalar(a.type) or _wrapped_float(a.type, v))
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                positional.append(v)
        node = self.graph.call_function(target, tuple(positional), kwargs)
        returns = schema.returns
        for j, r in enumerate(results):
            out = node if len(returns) == 1 else self.call(operator.getitem, node, j)
            if isinstance(r, (list, tuple)):
                for k, e in enumerate(r):
                    if isinstance(e, torch.Tensor):
                        self.result(op_index, e, self.call(operator.getitem, out, k))
            elif isinstance(r, torch.Tensor):
                self.result(op_index, r, out)

    def finish(self) -> fx.GraphModule:
        for i, ph in self.placeholders.items():
            if self.made[i]:
                flat = self.call(aten.as_strided.default, self.base[i], [self.flat[i].numel()], [1], 0)
                self.call(aten.copy_.default, ph, flat)
        self.graph.output(())
        return fx.GraphModule(torch.nn.Module(), self.graph)


def build_graph(ops: Sequence[tuple], storages: Sequence[tuple], floats: Sequence[tuple[float, bool]],
                device: torch.device) -> fx.GraphModule:
    """The FX graph of a recorded group (see the module's docstring)."""
    b = _Builder(storages, device, floats)
    for k, (name, overload, args, results, lift) in enumerate(ops):
        b.op(k, name, overload, args, results, lift)
    return b.finish()


def _is_scalar(t: Any) -> bool:
    """Whether an argument's type is Scalar (alone, optional or in a list): its floats are graph inputs."""
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch._C.ListType):
        t = t.getElementType()
    return isinstance(t, torch._C.NumberType)


def _wrapped_float(t: Any, v: Any) -> bool:
    """A Python float given for a Tensor argument (a wrapped number): an input too."""
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(v, float) and isinstance(t, torch._C.TensorType)





class _Scope:
    """What a group's graph compiles and runs under: no autograd, no autocast (its ops are recorded below both)."""

    def __enter__(self) -> None:
        self._grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        self._autocast = [(d, torch.is_autocast_enabled(d)) for d in ("neuron", "cpu")]
        for d, _ in self._autocast:
            torch.set_autocast_enabled(d, False)

    def __exit__(self, *exc: Any) -> None:
        for d, on in self._autocast:
            torch.set_autocast_enabled(d, on)
        torch._C._set_grad_enabled(self._grad)


def compile_group(ops: Sequence[tuple], storages: Sequence[tuple], floats: Sequence[tuple[float, bool]],
                  inputs: list[torch.Tensor]) -> Callable:
    """Compile a recorded group; returns ``run(inputs)``, which runs it on the group's flat storages."""
    from .dynamo_backend import neuron

    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    device = inputs[0].device if inputs and inputs[0].device.type == "neuron" else torch.device(
        "neuron", torch.neuron.current_device())
    gm = build_graph(ops, storages, floats, device)
    # Static shapes; a shape environment for the floats read inside the graph.
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    examples = [fake_mode.from_tensor(t, static_shapes=True) for t in inputs]
    with _Scope(), tracing(TracingContext(fake_mode)):
        compiled = neuron(gm, examples)

    def run(args: list[torch.Tensor]) -> None:
        with _Scope():
            compiled(*args)

    return run


# The pay-off rule (csrc/fused/fused.cpp): a group seen again is compiled once its op-by-op runs have
# cost enough that what compiling saves would have paid for the compile. What to expect, and how what a
# process measured changes that, is the policy's learning rule (csrc/fused/policy.h, _C._fused_policy()),
# on its figures. What a process measures is kept here, in HISTORY beside Inductor's caches, so the next
# process starts from it: a group's own compile time and gain, and the machine's cold compile time per op.
HISTORY = "torchneuron-fused-groups.json"


class _History:
    """What compiling groups cost and saved in earlier processes (a JSON file in the compile cache)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: str | None = None
        self.data: dict[str, Any] | None = None

    def load(self) -> dict[str, Any]:
        if self.data is None:
            from ._cache import cache_dir

            self.path = os.path.join(cache_dir(), HISTORY)
            try:
                with open(self.path) as f:
                    data = json.load(f)
                self.data = data if isinstance(data, dict) and isinstance(data.get("groups"), dict) else None
            except (OSError, ValueError):
                self.data = None
            if self.data is None:
                self.data = {"groups": {}}
        return self.data

    def save(self) -> None:
        assert self.path is not None and self.data is not None
        try:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".fused-groups-")
            with os.fdopen(fd, "w") as f:
                json.dump(self.data, f)
            os.replace(tmp, self.path)  # a reader sees the old file or the new one
        except OSError as e:
            log.warning("fused eager: could not keep what groups measured in %s: %s", self.path, e)


_history = _History()


def expect(key: int, ops: int) -> tuple[float, float]:
    """What compiling the group ``key`` (its signature's digest) of ``ops`` ops is expected to cost in
    seconds, and the fraction of its op-by-op run time a compiled run saves (the pay-off rule's view)."""
    with _history.lock:
        data = _history.load()
        group = data["groups"].get(f"{key:016x}")  # None: never compiled here, a cold compile
        return _C._fused_policy().expect(ops, data.get("cold_seconds_per_op"), group)


def learned(key: int, ops: int, compile_seconds: float, op_seconds: float, fused_seconds: float) -> None:
    """Keep what the group ``key`` measured: its compile took ``compile_seconds``; its runs took
    ``op_seconds`` op by op (0: not measured) and ``fused_seconds`` compiled (means)."""
    with _history.lock:
        data = _history.load()
        name = f"{key:016x}"
        rate, data["groups"][name] = _C._fused_policy().learn(
            ops, compile_seconds, op_seconds, fused_seconds, data.get("cold_seconds_per_op"), data["groups"].get(name))
        if rate is not None:
            data["cold_seconds_per_op"] = rate
        _history.save()


@dataclasses.dataclass
class FusedGroup:
    """One recorded group (a signature: its ops, their arguments' layouts, what stays referred to)."""

    ops: int
    seen: int
    fused_runs: int
    compiled: bool
    compile_seconds: float
    first_cut: str
    first_ops: list[str]
    error: str = ""
    op_runs: int = 0
    op_seconds: float = 0.0  # in all, run op by op
    fused_seconds: float = 0.0  # in all, run compiled (the first run left out)
    expected_compile_seconds: float = -1.0  # the pay-off rule's view, once asked (-1: not asked)
    expected_gain: float = 0.0
    skipped_runs: int = 0  # occurrences run unrecorded while it waited for its compile to pay,
    credited_seconds: float = 0.0  # and the op-by-op time they were credited with

    @property
    def waiting(self) -> str:
        """Why a group seen again is not compiled yet (the pay-off rule), or ""."""
        if self.compiled or self.error or self.expected_compile_seconds < 0:
            return ""
        ran = self.op_seconds + self.credited_seconds
        skipped = f", {self.skipped_runs} of them skipped unrecorded" if self.skipped_runs else ""
        return (f"pays for compiling (about {self.expected_compile_seconds:.1f} s) once its op-by-op runs "
                f"({ran:.2f} s so far{skipped}) x {self.expected_gain:.2f} saved reach it")


@dataclasses.dataclass
class FusedReport:
    """What fused eager did: the groups, how often each was seen, compiled and run fused, and what cut them."""

    mode: str
    recorded_ops: int
    groups: list[FusedGroup]
    cuts: dict[str, int]
    bypassed_ops: int = 0

    def __str__(self) -> str:
        lines = [f"fused eager: mode {self.mode}, {self.recorded_ops} ops recorded, {len(self.groups)} groups, "
                 f"{sum(g.compiled for g in self.groups)} compiled, {self.bypassed_ops} ops run unrecorded "
                 f"(fusing did not pay, or not yet)"]
        if self.groups:
            lines.append(f"  {'ops':>6} {'seen':>6} {'fused':>6} {'compile s':>9}  first cut / first ops")
            for g in sorted(self.groups, key=lambda g: -g.seen * g.ops)[:20]:
                lines.append(f"  {g.ops:>6} {g.seen:>6} {g.fused_runs:>6} {g.compile_seconds:>9.2f}  "
                             f"{g.first_cut} / {' '.join(g.first_ops[:6])}")
                if g.error:
                    lines.append(f"         not compiled: {g.error.splitlines()[0][:160]}")
                elif g.waiting:
                    lines.append(f"         not compiled yet: {g.waiting}")
            if len(self.groups) > 20:
                lines.append(f"  ... {len(self.groups) - 20} more groups")
        if self.cuts:
            lines.append("  cuts: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.cuts.items(), key=lambda kv: -kv[1])))
        return "\n".join(lines)


def fused_report(reset: bool = False) -> FusedReport:
    """What fused eager did so far in this process (see :class:`FusedReport`).

    Args:
        reset: forget the groups afterwards (compiled ones too) and start counting again.

    Example::

        >>> torch.neuron.set_eager_mode("fused")
        >>> for _ in range(3): train_step()
        >>> print(torchneuron.compile.fused_report())
    """

    stats = _C._fused_stats()
    report = FusedReport(
        mode=torch.neuron.get_eager_mode(),
        recorded_ops=stats["recorded_ops"],
        groups=[FusedGroup(**g) for g in stats["groups"]],
        cuts=dict(stats["cuts"]),
        bypassed_ops=stats["bypassed_ops"],
    )
    if reset:
        _C._fused_reset()
    return report
