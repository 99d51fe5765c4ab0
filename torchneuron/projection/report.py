"""The projection report: count a program's steps, then project them on several targets.

Every number this module produces is a projection from counted work and public specifications,
not a measurement, and says so in its output together with its assumptions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import torch

from torchneuron._patch import PatchSet, attribute
from torchneuron.projection import counting as C
from torchneuron.projection.model import ModelHints, Parallelism, Target, get_target, step_time

logger = logging.getLogger("torchneuron")

LABEL = "PROJECTION (not a measurement)"

ASSUMPTIONS = [
    "Work is counted per ATen op on one device; FLOPs of matmul/conv/attention from torch.utils.flop_counter, "
    "elementwise = output elements, reductions = input elements; bytes = every tensor argument read and result written.",
    "Kernel time = max(FLOPs / (published peak x generation efficiency), bytes / (HBM bandwidth x efficiency)) "
    "+ a fixed cost per op (eager) or per fused kernel (compiled: consecutive non-matmul ops fuse; fused: each "
    "recorded group of 32 ops or more is one graph launch of compiled kernels, smaller groups run eager).",
    "Tensor/pipeline parallel split each kernel's time over tp*pp devices; pipeline bubble (pp-1)/microbatches; "
    "data-parallel gradients synchronised by a ring all-reduce not overlapped with compute; ZeRO-1 shards the optimizer.",
    "An op registered with torchneuron.nki.nki_op is a kernel of its own: on Trainium its time is the estimate of "
    "the NKI kernels it ran on one NeuronCore of the generation (their recorded instructions at the engines' "
    "rates), on a GPU the roofline above.",
    "Collectives: ring bandwidth, 2(n-1)/n*bytes/bandwidth for all-reduce, plus a latency per hop of "
    "recursive halving/doubling (2*log2(n) hops); NeuronLink/NVLink inside an instance, EFA across.",
    "Memory per device = weights + gradients + optimizer state (fp32 master + 2 moments, sharded by ZeRO-1) "
    "+ counted activation peak / tp; no activation checkpointing or offload.",
    "Prices are on-demand list prices where a source was found (see hardware.json; some are unverified).",
]

_active: List["Projection"] = []


def mark_step(tokens: int = 0, samples: int = 0, audio_s: float = 0.0) -> None:
    """End a step of the program being counted, crediting it with ``tokens``, ``samples`` and
    ``audio_s`` seconds of audio (for speech models: cost per hour of audio).

    A no-op when nothing is counting, so a script can call it unconditionally.
    """
    if _active:
        _active[-1].counter.mark_step(tokens=tokens, samples=samples, audio_s=audio_s)


def declare(model: Optional[torch.nn.Module] = None, layers: int = 0, hidden: int = 0, params: int = 0,
            training: Optional[bool] = None) -> None:
    """Tell the projection counting this program what its kernels do not show (see
    :meth:`Projection.declare`). A no-op when nothing is counting."""
    if _active:
        _active[-1].declare(model=model, layers=layers, hidden=hidden, params=params, training=training)


def counting_fake() -> bool:
    """Whether the program runs under a fake-mode count (tensors without data)."""
    return bool(_active) and _active[-1].fake


@dataclass
class Projection:
    """Counted steps of a program, ready to be projected onto targets.

    Args:
        counter: the :class:`~torchneuron.projection.counting.CountingMode` that recorded them.
        fake: whether the program ran on fake tensors.
    """

    counter: C.CountingMode
    fake: bool = False
    hints: ModelHints = field(default_factory=ModelHints)
    wall_s: float = 0.0
    stopped: str = ""

    def step(self, tokens: int = 0, samples: int = 0, audio_s: float = 0.0) -> None:
        """End a step (see :func:`mark_step`)."""
        self.counter.mark_step(tokens=tokens, samples=samples, audio_s=audio_s)

    def declare(self, model: Optional[torch.nn.Module] = None, layers: int = 0, hidden: int = 0,
                params: int = 0, training: Optional[bool] = None) -> None:
        """Tell the projection what the kernels alone do not show.

        Args:
            model: parameters are counted from it (and their bytes from its first parameter).
            layers: transformer layers, for tensor/pipeline-parallel traffic.
            hidden: hidden size, for tensor/pipeline-parallel traffic.
            params: parameter count, when no model is given.
            training: False drops gradients and optimizer state from the memory estimate.
        """
        if model is not None:
            ps = list(model.parameters())
            self.hints.params = sum(p.numel() for p in ps)
            self.hints.param_bytes = ps[0].element_size() if ps else 2
        if params:
            self.hints.params = params
        if layers:
            self.hints.layers = layers
        if hidden:
            self.hints.hidden = hidden
        if training is False:
            self.hints.master_bytes = 0

    @property
    def steps(self) -> List[C.StepCounts]:
        return self.counter.completed_steps()

    def project(self, targets: Sequence[str], compare: Sequence[str] = (),
                parallel: Union[Parallelism, Mapping[str, Parallelism], None] = None,
                mode: str = "compiled", skip_first: bool = True,
                prices: Optional[Mapping[str, float]] = None) -> "Report":
        """Project the counted steps on each target and comparison.

        Args:
            targets: instance names to project on (Trainium, typically).
            compare: instance names to compare with (GPUs, typically).
            parallel: parallelism for every target, or a mapping from instance name to its own
                (missing names get the default); by default every device of the instance, data parallel.
            mode: ``"eager"``, ``"fused"`` (fused eager) or ``"compiled"``.
            skip_first: leave out the first step when there are more (warm-up, lazy optimizer state).
            prices: on-demand USD per hour by instance name, in place of ``hardware.json``'s (for
                instances without a published price, or your own rate); the report says so.
        """
        steps = self.steps
        if skip_first and len(steps) > 1:
            steps = steps[1:]
        if not steps:
            raise RuntimeError("projection: no work was counted; run at least one step inside the counting block")
        hints = ModelHints(**vars(self.hints))
        if not hints.params and self.counter.params:
            hints.params = self.counter.params
            hints.param_bytes = self.counter.param_bytes or 2
        names = list(targets) + [c for c in compare if c not in targets]
        if isinstance(parallel, Mapping):
            pars = {n: parallel.get(n, Parallelism()) for n in names}
        else:
            pars = {n: parallel or Parallelism() for n in names}
        par = pars[names[0]].on(get_target(names[0])) if names else Parallelism()
        rows = []
        timelines: Dict[str, List[Dict[str, Any]]] = {}
        for name in names:
            tgt = get_target(name)
            timelines[name] = []
            rows.append(_row(tgt, step_time(steps, tgt, pars[name], mode, hints, trace=timelines[name]), pars[name],
                             role="target" if name in targets else "compare", price=(prices or {}).get(name)))
        if rows:
            # Work per dollar: tokens (else samples, else steps) per dollar, relative to the first row.
            unit = "tokens_per_step" if rows[0]["tokens_per_step"] else "samples_per_step" if rows[0]["samples_per_step"] else None
            for r in rows:
                work = r[unit] if unit else 1.0
                r["usd_per_work"] = r["usd_per_step"] / work if r["usd_per_step"] and work else None
            base = rows[0]
            for r in rows:
                r["work_per_dollar_vs_first"] = (
                    (base["usd_per_work"] / r["usd_per_work"]) if r["usd_per_work"] and base["usd_per_work"] else None)
        summary = C.summarize(steps)
        summary.pop("by_class", None)
        summary["repeats"] = sum(1 for s in steps if s.repeat_of >= 0)
        summary["unmatched_steps"] = self.counter.unmatched_steps
        return Report(rows=rows, counted=summary, by_class=C.summarize(steps).get("by_class", {}),
                      fake=self.fake or self.counter.saw_fake,
                      parallel=vars(par), mode=mode, stopped=self.stopped, hints=vars(hints), timelines=timelines)


def _row(tgt: Target, t: Dict[str, Any], par: Parallelism, role: str, price: Optional[float] = None) -> Dict[str, Any]:
    step_s = t["step_s"]
    par = Parallelism(**t["parallel"])  # the split on this target, dp chosen where it was not given
    peak = tgt.peak_flops(t["dtype"]) * par.devices
    given = price is not None
    price = price if given else tgt.price_per_hour
    # Whole instances are billed: every device paid for, working or idle.
    usd_per_hour = price * t["nodes"] if price is not None else None
    paid = t["devices_paid"]
    idle = paid - par.devices
    usd_per_step = usd_per_hour * step_s / 3600.0 if usd_per_hour is not None else None
    tokens = t["tokens_per_step"]
    return {
        "target": tgt.name, "role": role, "chip": tgt.chip_name, "device": tgt.chip["device_name"],
        "devices": par.devices, "devices_paid": paid, "idle_devices": idle,
        "idle_usd_per_hour": usd_per_hour * idle / paid if usd_per_hour is not None and paid else None,
        "nodes": t["nodes"], "mode": t["mode"], "dtype": t["dtype"],
        "parallel": vars(par), "tokens_per_step": tokens, "samples_per_step": t["samples_per_step"],
        "step_s": step_s, "breakdown": t["breakdown"],
        "mfu": t["matmul_flops_per_step"] / (step_s * peak) if step_s and peak else 0.0,
        "tokens_per_s": tokens / step_s if tokens and step_s else None,
        "samples_per_s": t["samples_per_step"] / step_s if t["samples_per_step"] and step_s else None,
        "audio_s_per_step": t["audio_s_per_step"],
        "audio_hours_per_hour": t["audio_s_per_step"] / step_s if t["audio_s_per_step"] and step_s else None,
        "usd_per_audio_hour": (usd_per_step * 3600.0 / t["audio_s_per_step"]
                               if usd_per_step and t["audio_s_per_step"] else None),
        "steps_per_s": 1.0 / step_s if step_s else None,
        "usd_per_hour": usd_per_hour,
        "usd_per_step": usd_per_step,
        "usd_per_million_tokens": usd_per_step / tokens * 1e6 if usd_per_step and tokens else None,
        "memory": t["memory"],
        "nki_ops": t.get("nki_ops", {}),
        "price_verified": False if given else _price_verified(tgt),
        "price_given": given,
    }


def _price_verified(tgt: Target) -> bool:
    for row in tgt.sources():
        if row["quantity"].endswith("price_per_hour"):
            return row["verified"]
    return False


@dataclass
class Report:
    """The projection of counted work on several targets; :meth:`format` prints it, :meth:`to_dict` saves it."""

    rows: List[Dict[str, Any]]
    counted: Dict[str, Any]
    by_class: Dict[str, Any]
    fake: bool
    parallel: Dict[str, Any]
    mode: str
    stopped: str = ""
    hints: Dict[str, Any] = field(default_factory=dict)
    timelines: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict, repr=False)

    def chrome_trace(self) -> Dict[str, Any]:
        """The projected device timeline of one optimizer step per target, in the Chrome trace
        format (``chrome://tracing``, Perfetto): one process per target, one thread per engine,
        kernels back to back in program order (no overlap is modelled), each kernel's time summed
        over the step's microbatches."""
        events: List[Dict[str, Any]] = []
        tracks = ["tensor", "vector", "scalar", "gpsimd", "memory-bound", "launch", "collectives"]
        for pid, (target, timeline) in enumerate(self.timelines.items(), start=1):
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"{target} (PROJECTION, {self.mode})"}})
            for tid, track in enumerate(tracks, start=1):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
            t = 0.0
            for e in timeline:
                dur = e["seconds"] * 1e6
                args = {k: v for k, v in e.items() if k not in ("name", "track", "seconds")}
                events.append({"ph": "X", "name": e["name"], "cat": e["track"], "pid": pid,
                               "tid": tracks.index(e["track"]) + 1 if e["track"] in tracks else len(tracks) + 1,
                               "ts": t, "dur": dur, "args": args})
                t += dur
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"label": LABEL, "assumptions": ASSUMPTIONS}}

    def write_chrome_trace(self, path: str) -> None:
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        import json

        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)

    def row(self, target: str) -> Dict[str, Any]:
        """The row of one target."""
        for r in self.rows:
            if r["target"] == target:
                return r
        raise KeyError(target)

    def to_dict(self) -> Dict[str, Any]:
        return {"label": LABEL, "assumptions": ASSUMPTIONS, "fake": self.fake, "mode": self.mode,
                "parallel": self.parallel, "hints": self.hints, "counted_per_step": self.counted,
                "counted_by_class": self.by_class, "stopped": self.stopped, "targets": self.rows,
                "sources": {r["target"]: get_target(r["target"]).sources() for r in self.rows}}

    def format(self) -> str:
        """A plain-text table, labelled as a projection, with its assumptions."""
        c = self.counted
        p = self.parallel
        lines = [f"== {LABEL} ==",
                 f"counted per step ({'fake/meta tensors, nothing computed' if self.fake else 'real run'}, {c['steps']} step(s) averaged): "
                 f"{c['flops'] / 1e9:,.3f} GFLOP, {_bytes(c['bytes'])} moved, {c['ops']:,.0f} ops"
                 + (f", {c['tokens']:,.0f} tokens" if c.get("tokens") else "")
                 + (f", {c['samples']:,.0f} samples" if c.get("samples") else "")
                 + (f", {c['audio_s']:,.0f} s of audio" if c.get("audio_s") else ""),
                 f"parallelism: dp={p['dp']} tp={p['tp']} pp={p['pp']} microbatches={p['microbatches']} "
                 f"zero1={p['zero1']}; mode={self.mode}"]
        if c.get("repeats"):
            lines.append(f"note: {c['steps'] - c['repeats']} step(s) counted op by op; {c['repeats']} watched through "
                         "the profiler repeat one of them kernel for kernel and carry its counts")
        if c.get("unmatched_steps"):
            lines.append(f"note: {c['unmatched_steps']} watched step(s) repeat no fully counted step (their kernels, "
                         "shapes or dtypes differ) and are left out; count(full_steps=None) or --count-every-step "
                         "counts each step op by op")
        if self.stopped:
            lines.append(f"note: {self.stopped}")
        head = f"{'target':<18}{'role':<8}{'step':>11}{'MFU':>7}{'tokens/s':>12}{'samples/s':>11}{'$/hour':>11}{'$/Mtok':>9}{'work/$':>8}  memory/device"
        lines += ["", head, "-" * len(head)]
        for r in self.rows:
            mem = r["memory"]
            lines.append(
                f"{r['target']:<18}{r['role']:<8}{_time(r['step_s']):>11}{_pct(r['mfu']):>7}"
                f"{_num(r['tokens_per_s']):>12}{_num(r['samples_per_s']):>11}"
                f"{_money(r['usd_per_hour'], r['price_verified']):>11}{_money(r['usd_per_million_tokens'], True):>9}"
                f"{_ratio(r['work_per_dollar_vs_first']):>8}  "
                f"{_bytes(mem['per_device_bytes'])} of {_bytes(mem['capacity_bytes'])} "
                f"{'fits' if mem['fits'] else 'does not fit'}")
        if any(r.get("audio_hours_per_hour") for r in self.rows):
            lines += ["", "audio (hours of audio per hour of the job; USD per hour of audio):"]
            for r in self.rows:
                usd = r["usd_per_audio_hour"]
                lines.append(f"  {r['target']}: {r['audio_hours_per_hour']:,.1f} h/h, "
                             f"{'n/a' if usd is None else f'${usd:,.4f}'} per hour of audio")
        lines += ["", "parallelism per target (cost divides the whole instances' price by the work of every device used):"]
        for r in self.rows:
            q = r["parallel"]
            idle = ""
            if r.get("idle_devices"):
                idle = (f"; {r['idle_devices']} idle" + (f", costing ${r['idle_usd_per_hour']:,.2f} of the "
                        f"${r['usd_per_hour']:,.2f}/h paid" if r.get("idle_usd_per_hour") is not None else ""))
            lines.append(f"  {r['target']}: dp={q['dp']} tp={q['tp']} pp={q['pp']} microbatches={q['microbatches']} "
                         f"({r['devices']} of {r.get('devices_paid', r['devices'])} devices of {r['nodes']} instance(s){idle})")
        lines += ["", "breakdown of the step (seconds per device):"]
        for r in self.rows:
            parts = ", ".join(f"{k} {_time(v)}" for k, v in sorted(r["breakdown"].items(), key=lambda kv: -kv[1]) if v)
            lines.append(f"  {r['target']}: {parts}")
        nki_ops = [name for r in self.rows for name in r.get("nki_ops", {})]
        if nki_ops:
            lines += ["", "ops running NKI kernels (nki_op), per step and device: on Trainium their kernels' own "
                          "estimate on one NeuronCore (Kernel.estimate), on a GPU the roofline:"]
            for name in dict.fromkeys(nki_ops):
                rows = [r for r in self.rows if name in r.get("nki_ops", {})]
                first = rows[0]["nki_ops"][name]
                kernels = ", ".join(dict.fromkeys(first["kernels"]))
                lines.append(f"  {name} (NKI kernel {kernels}), {first['calls']:,.0f} call(s):")
                lines += [f"    {r['target']}: {_time(r['nki_ops'][name]['seconds'])} ({r['nki_ops'][name]['how']})"
                          for r in rows]
        given = [f"{r['target']} ${r['usd_per_hour'] / r['nodes']:,.2f}" for r in self.rows if r.get("price_given")]
        if given:
            lines += ["", "prices per instance-hour given by the user, not from hardware.json: " + ", ".join(given)]
        lines += ["", "assumptions:"] + [f"  - {a}" for a in ASSUMPTIONS]
        lines.append("  - '*' after a price: not read from AWS's own pricing page (see hardware.json sources).")
        lines.append("work/$ = work per dollar relative to the first target (higher is cheaper).")
        return "\n".join(lines)


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%" if x >= 0.01 else f"{x * 100:.3f}%"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:.0f} B"


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.1f}" if x < 1e4 else f"{x:,.0f}"


def _money(x: Optional[float], verified: bool) -> str:
    """Dollars with cents, or three significant figures below a dollar (0.00123, not 0.00)."""
    if x is None:
        return "n/a"
    text = f"{x:,.2f}" if x >= 1.0 or x == 0.0 else f"{x:.3g}"
    return text + ("" if verified else "*")


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}x"


@contextlib.contextmanager
def count(fake: bool = False, group_size: int = 1, full_steps: Optional[int] = 2) -> Iterator[Projection]:
    """Count the work of the steps run inside the block.

    Args:
        fake: run on fake tensors (nothing computed or allocated; values read back to Python are 1).
        group_size: ranks assumed for collectives whose group cannot be read.
        full_steps: on a real run, count this many steps op by op (a Python dispatch mode, about
            twice the step's time), then watch the later steps through PyTorch's profiler (a few
            percent) and give each the counts of the fully counted step whose kernels, shapes and
            dtypes it repeats; a step that repeats none is left out and reported. ``None`` counts
            every step op by op. Fake runs always count every step.

    Example::

        with torchneuron.projection.count() as p:
            for x, y in batches:
                loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
                p.step(samples=len(x))
        print(p.project(["trn2.48xlarge"], compare=["p5.48xlarge"]).format())
    """
    counter = C.CountingMode(group_size=group_size, full_steps=None if fake else full_steps)
    proj = Projection(counter, fake=fake)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if fake:
            stack.enter_context(C.fake_mode())
            stack.enter_context(FAKE_PATCHES.scope())
        stack.enter_context(counter)
        _active.append(proj)
        try:
            yield proj
        finally:
            _active.remove(proj)
            proj.wall_s = time.perf_counter() - start
    if counter.data_dependent_reads:
        logger.warning("projection: %d value(s) read back to Python were 1 in fake mode", counter.data_dependent_reads)


def _fake_module_moves(original: Any) -> Any:
    """``Module._apply`` for modules whose parameters are fake: new parameters (and buffers) in their place.

    ``Module.to``, ``.neuron()``, ``.half()`` and the like go through ``Module._apply``, which swaps
    each parameter for its converted copy, and PyTorch cannot swap a fake parameter.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    def _apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        if not isinstance(next(iter(self.parameters()), None), FakeTensor):
            return original(self, fn, recurse)
        with torch.no_grad():
            for module in self.modules() if recurse else [self]:
                for name, p in list(module._parameters.items()):
                    if p is not None:
                        module._parameters[name] = torch.nn.Parameter(fn(p), requires_grad=p.requires_grad)
                for name, b in list(module._buffers.items()):
                    if b is not None:
                        module._buffers[name] = fn(b)
        return self

    return _apply


#: The one change to PyTorch made while counting on fake tensors, in force for the count.
FAKE_PATCHES = PatchSet("projection on fake tensors", (
    attribute(torch.nn.Module, "_apply", _fake_module_moves,
              "a module whose parameters are fake gets new parameters from .to(), .half() and the like "
              "(PyTorch cannot swap a fake parameter)", target="torch.nn.Module._apply"),
))


def run_script(path: str, argv: Sequence[str], fake: bool = False, full_steps: Optional[int] = 2,
               module: bool = False) -> Projection:
    """Run a Python script (or, with ``module``, a module, as ``python -m`` does) as ``__main__``
    while counting its work.

    Under ``fake`` a data-dependent shape (``nonzero``, boolean indexing...) stops the run; the steps
    counted before it are kept and the report says where it stopped. ``full_steps`` as for :func:`count`.
    """
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    if not module:  # as `python script.py` has it: the script's directory first, for the modules beside it
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        with count(fake=fake, full_steps=full_steps) as proj:
            try:
                if module:
                    runpy.run_module(path, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
            except Exception as e:  # noqa: BLE001 - reported, and the counted steps are kept
                if not fake or not proj.counter.completed_steps():
                    raise
                proj.stopped = (f"fake mode stopped the script at {type(e).__name__}: {str(e).splitlines()[0][:160]}; "
                                f"{len(proj.counter.completed_steps())} step(s) counted before it are projected")
                logger.warning("projection: %s", proj.stopped)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    return proj
