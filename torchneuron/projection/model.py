"""Hardware targets and the time model: how long counted work would take on a device.

Per kernel: ``time = max(FLOPs / rate(engine, dtype), bytes / HBM bandwidth) + fixed cost``.
Rates are the published peaks of :file:`hardware.json` scaled by one efficiency per chip
generation (never per model). The engine follows the op class: matmul and convolution on the
tensor engine, elementwise and reductions on the vector engine, transcendentals on the scalar
(activation) engine, gather/scatter and copies as DMA (memory only), sort on the GPSIMD cores.
An op registered with ``torchneuron.nki.nki_op`` is a kernel of its own: on a Trainium target its
time is the estimate of the NKI kernels it ran on one NeuronCore of that generation
(``Kernel.estimate``'s cost model), on a GPU the roofline above.
Eager execution pays a launch cost per op; compiled execution fuses each run of consecutive
non-matmul ops into one kernel (it reads the tensors its ops did not produce and writes those no
later op of it consumes) and pays a smaller cost per kernel. Fused eager runs each group of ops
between two of its cuts (host reads and copies, random ops, collectives) as one compiled graph, a
launch for the graph and a kernel's cost per fused kernel, and groups too small to compile op by op. Collectives move a ring's bytes (all-reduce ``2(n-1)/n·bytes`` over the link
bandwidth; all-gather and reduce-scatter half that) and pay a latency per hop of recursive
halving/doubling (``log2 n`` hops each way).

Parallelism applies to the counted single-device step: tensor (Megatron) and pipeline parallel
split the model's kernels across ``tp·pp`` devices (launches split by ``pp`` only), data
parallel multiplies throughput by ``dp``, ZeRO-1 shards optimizer work and state over ``dp``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from torchneuron import _C
from torchneuron.projection import counting as C

logger = logging.getLogger("torchneuron")

HARDWARE_PATH = Path(__file__).with_name("hardware.json")


@functools.lru_cache(maxsize=None)
def load_hardware(path: Optional[str] = None) -> Dict[str, Any]:
    """Read the hardware data file (default: :data:`HARDWARE_PATH`)."""
    with open(path or HARDWARE_PATH) as f:
        return json.load(f)


def _val(entry: Any) -> Any:
    return entry[0] if isinstance(entry, list) else entry


def _dtype_key(dtype: str) -> str:
    if dtype in ("bfloat16", "float16", "float32"):
        return dtype
    if dtype.startswith("float8"):
        return "float8"
    if dtype in ("float64",):
        return "float32"
    return "bfloat16" if dtype in ("int8", "uint8") else "float32"


@dataclass
class Target:
    """One instance type, its chip and the chip generation's parameters.

    Args:
        name: instance name, e.g. ``trn2.48xlarge``.
    """

    name: str
    instance: Dict[str, Any] = field(repr=False)
    chip_name: str = ""
    chip: Dict[str, Any] = field(default_factory=dict, repr=False)
    gen: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_neuron(self) -> bool:
        return self.chip["generation"].startswith("trainium")

    @property
    def nki_target(self) -> Optional[str]:
        """The NKI platform target of the chip's NeuronCores (``trn1``, ``trn2``, ``trn3``); None for GPUs."""
        return _NKI_TARGETS.get(self.chip["generation"])

    @property
    def devices_per_chip(self) -> int:
        return int(self.chip["devices_per_chip"])

    @property
    def devices_per_instance(self) -> int:
        return int(_val(self.instance["chips"])) * self.devices_per_chip

    def peak_flops(self, dtype: str) -> float:
        """Published dense matmul peak per device for ``dtype``."""
        return float(_val(self.chip["matmul_flops"][_dtype_key(dtype)])) / self.devices_per_chip

    def rate(self, engine: str, dtype: str) -> float:
        """Sustained FLOP/s of ``engine`` on one device (peak times the generation's efficiency)."""
        if engine == "tensor":
            return self.peak_flops(dtype) * float(_val(self.gen["matmul_efficiency"]))
        if self.is_neuron:
            cores = int(self.chip["cores_per_chip"]) / self.devices_per_chip
            clock = float(_val(self.chip["clock_hz"]))
            if engine == "scalar":
                return float(_val(self.chip["scalar_flops_per_cycle_per_core"])) * clock * cores
            per_cycle = float(_val(self.chip["vector_flops_per_cycle_per_core"]))
            return per_cycle * clock * cores / (4.0 if engine == "gpsimd" else 1.0)
        return float(_val(self.chip["vector_flops"])) / (4.0 if engine == "gpsimd" else 1.0)

    @property
    def hbm_bytes(self) -> float:
        """Device memory per device."""
        return float(_val(self.chip["hbm_bytes"])) / self.devices_per_chip

    @property
    def hbm_bandwidth(self) -> float:
        """Sustained HBM bytes/s per device."""
        return float(_val(self.chip["hbm_bytes_per_s"])) / self.devices_per_chip * float(_val(self.gen["memory_efficiency"]))

    @property
    def link_bandwidth(self) -> float:
        """Sustained chip-to-chip bytes/s per device inside an instance."""
        return float(_val(self.chip["chip_link_bytes_per_s"])) / self.devices_per_chip * float(_val(self.gen["comm_efficiency"]))

    @property
    def network_bandwidth(self) -> float:
        """Sustained bytes/s per device across instances (EFA shared by the instance's devices)."""
        net = _val(self.instance["network_bytes_per_s"])
        if not net:
            return self.link_bandwidth
        return float(net) / self.devices_per_instance * float(_val(self.gen["comm_efficiency"]))

    @property
    def price_per_hour(self) -> Optional[float]:
        price = _val(self.instance["price_per_hour"])
        return None if price is None else float(price)

    def sources(self) -> List[Dict[str, Any]]:
        """Every number this target uses, with its source and whether it was read from a primary copy."""
        hw = load_hardware()
        rows = []

        def add(prefix: str, d: Dict[str, Any]) -> None:
            for key, entry in d.items():
                if isinstance(entry, dict):
                    add(f"{prefix}{key}.", entry)
                elif isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str):
                    src = hw["sources"].get(entry[1], {})
                    rows.append({"quantity": prefix + key, "value": entry[0], "source": src.get("title", entry[1]),
                                 "url": src.get("url", ""), "verified": bool(src.get("verified", False))})

        add(f"{self.name}.", self.instance)
        add(f"{self.chip_name}.", self.chip)
        add(f"{self.chip['generation']}.", self.gen)
        return rows


def targets() -> List[str]:
    """Names of every instance in the hardware file."""
    return sorted(load_hardware()["instances"])


def get_target(name: str) -> Target:
    """The :class:`Target` for an instance name.

    Raises:
        ValueError: the name is not in :file:`hardware.json`.
    """
    hw = load_hardware()
    if name not in hw["instances"]:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(targets())}")
    inst = hw["instances"][name]
    chip = hw["chips"][inst["chip"]]
    return Target(name, inst, inst["chip"], chip, hw["generations"][chip["generation"]])


@dataclass
class Parallelism:
    """How the counted single-device step is spread.

    Args:
        dp: data-parallel replicas; ``None`` (the default): as many as fill the instances the job
            is billed for, so that every paid device works (see :meth:`on`).
        tp: tensor-parallel (Megatron) degree.
        pp: pipeline stages.
        microbatches: forward/backward passes per optimizer step (gradient accumulation; the
            pipeline's microbatches).
        zero1: shard optimizer state and update over ``dp`` (ZeRO-1).
        nodes: instances; by default the fewest that hold ``dp·tp·pp`` devices (one, when ``dp``
            fills them).
    """

    dp: Optional[int] = None
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    zero1: bool = True
    nodes: Optional[int] = None

    @property
    def devices(self) -> int:
        """Devices the split uses (``tp·pp`` per replica while ``dp`` is not yet chosen)."""
        return (self.dp or 1) * self.tp * self.pp

    def on(self, target: "Target") -> "Parallelism":
        """This split on ``target``, with ``dp`` and ``nodes`` chosen where they were not given.

        Without ``dp``, data-parallel replicas fill the instances: ``nodes·devices_per_instance //
        (tp·pp)`` of them (at least one). Without ``nodes``, the fewest instances that hold the
        split's devices.

        Raises:
            ValueError: a degree below 1, or more devices than ``nodes`` instances hold.
        """
        for key in ("tp", "pp", "microbatches"):
            if getattr(self, key) < 1:
                raise ValueError(f"parallelism: {key} must be at least 1, got {getattr(self, key)}")
        if self.dp is not None and self.dp < 1:
            raise ValueError(f"parallelism: dp must be at least 1, got {self.dp}")
        per_node = target.devices_per_instance
        model = self.tp * self.pp
        nodes = self.nodes or max(1, math.ceil(self.devices / per_node))
        dp = self.dp if self.dp is not None else max(1, nodes * per_node // model)
        if self.nodes is not None and dp * model > self.nodes * per_node:
            raise ValueError(f"parallelism: dp={dp} tp={self.tp} pp={self.pp} needs {dp * model} devices, more than "
                             f"{self.nodes} {target.name} instance(s) hold ({self.nodes * per_node})")
        return dataclasses.replace(self, dp=dp, nodes=nodes)


@dataclass
class ModelHints:
    """What the time model needs to know about the model beyond its kernels.

    Args:
        params: parameter count (for gradient all-reduce, ZeRO-1 and memory).
        param_bytes: bytes per parameter as stored for compute (2 for bf16).
        layers: transformer layers (for tensor- and pipeline-parallel traffic).
        hidden: hidden size (activation size per token).
        act_bytes: bytes per activation element.
        master_bytes: optimizer bytes per parameter beyond the weights (fp32 master copy and two
            Adam moments: 12); 0 for inference.
        matmul_dtype: the dtype matmuls run in when it is not the counted one (``"float8"`` for
            FP8 training of a bf16 model: the tensor engine's FP8 rate); empty: as counted.
    """

    params: int = 0
    param_bytes: int = 2
    layers: int = 0
    hidden: int = 0
    act_bytes: int = 2
    master_bytes: int = 12
    matmul_dtype: str = ""


ENGINE_OF = {
    C.MATMUL: "tensor", C.ELEMENTWISE: "vector", C.REDUCTION: "vector", C.TRANSCENDENTAL: "scalar",
    C.GATHER_SCATTER: "dma", C.COPY: "dma", C.SORT: "gpsimd",
}
_NKI_TARGETS = {"trainium1": "trn1", "trainium2": "trn2", "trainium3": "trn3"}
# The timeline's track of an NKI kernel, by the engine its estimate is bound by.
_NKI_TRACKS = {"TensorE": "tensor", "VectorE": "vector", "ScalarE": "scalar", "GpSimd": "gpsimd", "DMA": "memory-bound"}


def _fused_bytes(run: Sequence[C.OpRecord]) -> float:
    """Memory traffic of one fused kernel: tensors it reads that its ops did not produce, once each,
    and tensors its ops produce that no later op of the kernel consumes."""
    if not all(op.inputs or op.outputs for op in run):
        return run[0].bytes_read + run[-1].bytes_written
    produced: Dict[int, int] = {}
    consumed = set()
    read = 0
    seen = set()
    for op in run:
        for tid, nbytes in op.inputs:
            if tid in produced:
                consumed.add(tid)
            elif tid not in seen:
                seen.add(tid)
                read += nbytes
        for tid, nbytes in op.outputs:
            produced[tid] = nbytes
            consumed.discard(tid)
    written = sum(n for tid, n in produced.items() if tid not in consumed)
    return read + written


MODES = ("eager", "fused", "compiled")


def _kernels(ops: Sequence[C.OpRecord], mode: str, launch_s: float = 0.0, kernel_s: float = 0.0) -> List[Dict[str, Any]]:
    """Group op records into kernels, each with its fixed cost per call (``fixed``, seconds).

    ``eager``: one kernel per op, a launch each. ``compiled``: each run of consecutive non-matmul
    ops in one phase is one kernel, matmuls their own, a kernel's cost each. ``fused`` (fused
    eager in its steady state): the ops between two of fused eager's cuts form a group; a group of
    ``max_ops`` or fewer and at least ``min_ops`` ops (the figures of fused eager's policy as they are
    now, ``torchneuron._C._fused_policy()``) runs as one compiled graph
    (its kernels as in ``compiled``, plus one launch for the graph), a smaller one op by op, and an
    op fused eager cannot record (a random op, a copy to or from the host, a collective, a
    data-dependent shape) by itself, op by op.
    """
    kernels: List[Dict[str, Any]] = []
    if mode == "fused":
        group: List[C.OpRecord] = []
        figures = _C._fused_policy().figures()  # read live: a changed figure changes the projection
        min_ops, max_ops = figures["min_ops"], figures["max_ops"]

        def close() -> None:
            if len(group) >= min_ops:
                kernels.append({"flops": {}, "bytes": 0, "calls": 1, "phase": group[0].phase,
                                "name": f"fused group launch ({len(group)} ops)", "fixed": launch_s})
                kernels.extend(_kernels(group, "compiled", launch_s, kernel_s))
            else:
                kernels.extend(_kernels(group, "eager", launch_s, kernel_s))
            group.clear()

        for op in ops:
            if op.cls == C.COLLECTIVE:
                close()
                continue
            if op.cut or len(group) >= max_ops:
                close()
            if op.cut in C.RUNS_ALONE:
                kernels.extend(_kernels([op], "eager", launch_s, kernel_s))
            else:
                group.append(op)
        close()
        return kernels

    run: List[C.OpRecord] = []

    def flush() -> None:
        if not run:
            return
        by_engine: Dict[Any, float] = {}
        for op in run:
            by_engine[(ENGINE_OF[op.cls], op.dtype)] = by_engine.get((ENGINE_OF[op.cls], op.dtype), 0.0) + op.flops
        names = [op.name.split(".")[1] if op.name.startswith("aten.") else op.name for op in run]
        label = names[0] if len(names) == 1 else f"fused {names[0]} +{len(names) - 1}"
        kernels.append({"flops": by_engine, "bytes": _fused_bytes(run), "calls": 1, "phase": run[0].phase,
                        "name": label, "fixed": kernel_s})
        run.clear()

    for op in ops:
        if op.cls == C.COLLECTIVE:
            continue
        if mode == "eager" or op.cls == C.MATMUL or op.nki is not None:  # an NKI op is a kernel of its own
            flush()
            kernels.append({"flops": {(ENGINE_OF[op.cls], op.dtype): op.flops},
                            "bytes": op.bytes_read + op.bytes_written, "calls": op.count, "phase": op.phase,
                            "name": op.name, "fixed": launch_s if mode == "eager" else kernel_s, "nki": op.nki})
        else:
            if run and run[-1].phase != op.phase:
                flush()
            run.append(op)
    flush()
    return kernels


def collective_time(kind: str, nbytes: float, group: int, target: Target, across_nodes: bool) -> float:
    """Seconds for one collective of ``nbytes`` per rank over ``group`` ranks.

    Bandwidth term of a ring (all-reduce ``2(n-1)/n·bytes``, all-gather and reduce-scatter
    ``(n-1)/n·bytes``); latency of recursive halving/doubling, ``log2(n)`` hops each way, which is
    what collective libraries switch to when messages are small.
    """
    if group <= 1 or nbytes <= 0:
        return 0.0
    bw = target.network_bandwidth if across_nodes else target.link_bandwidth
    lat = float(_val(target.gen["network_latency_s" if across_nodes else "link_latency_s"]))
    n = group
    hops = math.ceil(math.log2(n))
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes / bw + 2 * hops * lat
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes / bw + hops * lat
    return nbytes / bw + lat


def step_time(steps: Sequence[C.StepCounts], target: Target, par: Optional[Parallelism] = None,
              mode: str = "compiled", hints: Optional[ModelHints] = None,
              trace: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Project the time of one optimizer step per device, with its breakdown.

    Args:
        steps: counted steps (averaged); each is one microbatch's forward/backward plus, if
            training, one optimizer step, on one device.
        target: the instance to project on.
        par: parallelism (default: one device).
        mode: ``"eager"`` (launch per op), ``"fused"`` (fused eager: its groups as compiled
            graphs, see :func:`_kernels`) or ``"compiled"`` (fused kernels).
        hints: model facts for parallel traffic and memory.
        trace: if given, receives the projected timeline of one optimizer step on one device (the
            last counted step's kernels in order, then the parallel traffic): one dict per kernel
            with ``name``, ``track`` (engine, memory, launch or collectives) and ``seconds``.

    Returns:
        A dict: ``step_s``, ``breakdown`` (seconds by component), ``memory`` (bytes per device,
        capacity, fits), ``flops`` (per step, all devices), ``tokens``/``samples`` per step, and
        ``nki_ops``: per op that ran NKI kernels, its ``kernels``, ``calls`` and ``seconds`` per step
        and device, and ``how`` they were costed (the kernels' estimate, or the roofline on a GPU).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    par = (par or Parallelism()).on(target)
    hints = hints or ModelHints()
    nsteps = max(1, len(steps))
    devices_per_node = target.devices_per_instance
    nodes = par.nodes
    launch_s, kernel_s = float(_val(target.gen["launch_s"])), float(_val(target.gen["kernel_s"]))

    breakdown: Dict[str, float] = {}

    def add(key: str, seconds: float) -> None:
        breakdown[key] = breakdown.get(key, 0.0) + seconds

    model_split = par.tp * par.pp
    m = par.microbatches
    bubble = (par.pp - 1) / m if par.pp > 1 else 0.0
    nki_target = target.nki_target
    nki_ops: Dict[str, Dict[str, Any]] = {}
    for index, step in enumerate(steps):
        traced = trace is not None and index == len(steps) - 1
        for k in _kernels(step.ops, mode, launch_s, kernel_s):
            training_opt = k["phase"] == "optimizer"
            split = model_split * (par.dp if (training_opt and par.zero1) else 1)
            repeat = 1 if training_opt else m * (1 + bubble)
            w = repeat / split / nsteps
            estimate = k.get("nki")
            if estimate is not None and nki_target is not None:
                # An op running NKI kernels, on a NeuronCore: their own estimate, not the roofline.
                busy, how = estimate.seconds[nki_target], f"{estimate.bound(nki_target)}-bound estimate"
                track = _NKI_TRACKS.get(estimate.bound(nki_target), "vector")
                add("nki kernels", busy * w)
            else:
                compute = {e: f / target.rate(e[0], hints.matmul_dtype if hints.matmul_dtype and e[0] == "tensor" else e[1])
                           for e, f in k["flops"].items() if f and e[0] != "dma"}
                compute_s = sum(compute.values())
                memory_s = k["bytes"] / target.hbm_bandwidth
                bound = "compute" if compute_s >= memory_s and compute else "memory"
                if bound == "compute":
                    for (engine, _), s in compute.items():
                        add(f"compute:{engine}", s * w)
                else:
                    add("memory-bound", memory_s * w)
                busy, how = max(compute_s, memory_s), f"roofline, {bound}-bound"
                track = max(compute, key=compute.get)[0] if bound == "compute" else "memory-bound"
            if estimate is not None:
                row = nki_ops.setdefault(k["name"], {"kernels": list(estimate.kernels), "calls": 0.0, "seconds": 0.0})
                row["calls"] += k["calls"] * repeat / nsteps
                row["seconds"] += busy * w
                row["how"] = how
            launch = k["fixed"] * k["calls"] * repeat / par.pp
            add("launch overhead", launch / nsteps)
            if traced and busy:
                event = {"name": k["name"], "track": track, "seconds": busy * repeat / split,
                         "phase": k["phase"], "flops": sum(k["flops"].values()), "bytes": k["bytes"]}
                if estimate is not None:
                    event["nki_kernels"] = list(estimate.kernels)
                    event["cost"] = how
                trace.append(event)
                if launch:
                    trace.append({"name": "launch", "track": "launch", "seconds": launch})
        for op in step.ops:
            if op.cls == C.COLLECTIVE:
                group = op.group_size or 1
                t = collective_time(op.collective, op.bytes_read, group, target, group > devices_per_node) * m
                add("collectives:program", t / nsteps)
                if traced:
                    trace.append({"name": f"{op.collective} ({group} ranks)", "track": "collectives", "seconds": t})

    training = any(op.phase == "optimizer" for s in steps for op in s.ops)
    # Data-parallel gradient synchronisation (ZeRO-1: reduce-scatter + all-gather = one all-reduce);
    # replicas that only run forward (inference) exchange nothing.
    if par.dp > 1 and training:
        if hints.params:
            grad_bytes = hints.params * hints.param_bytes / model_split
            across = par.devices > devices_per_node
            add("collectives:dp", collective_time("all_reduce", grad_bytes, par.dp, target, across))
        else:
            logger.warning("projection: dp=%d without a parameter count; gradient all-reduce not modelled", par.dp)
    tokens = sum(s.tokens for s in steps) / nsteps
    samples = sum(s.samples for s in steps) / nsteps
    audio_s = sum(s.audio_s for s in steps) / nsteps
    # Tensor parallel: Megatron's 2 all-reduces per layer forward and 2 backward, of the activations.
    if par.tp > 1:
        if hints.layers and hints.hidden and tokens:
            act = tokens * hints.hidden * hints.act_bytes
            per_layer = 4 if training else 2
            across = par.tp > devices_per_node
            t = collective_time("all_reduce", act, par.tp, target, across) * per_layer * hints.layers / par.pp
            add("collectives:tp", t * m)
        else:
            logger.warning("projection: tp=%d without layers/hidden/tokens; tensor-parallel traffic not modelled", par.tp)
    if par.pp > 1 and hints.hidden and tokens:
        act = tokens * hints.hidden * hints.act_bytes / par.tp
        across = par.devices > devices_per_node
        add("collectives:pp", collective_time("send", act, 2, target, across) * (2 if training else 1) * m)

    if trace is not None:
        for key in ("collectives:dp", "collectives:tp", "collectives:pp"):
            if breakdown.get(key):
                trace.append({"name": {"collectives:dp": "data-parallel gradient all-reduce",
                                       "collectives:tp": "tensor-parallel all-reduces (all layers)",
                                       "collectives:pp": "pipeline sends"}[key],
                              "track": "collectives", "seconds": breakdown[key]})
    step_s = sum(breakdown.values())
    # Memory per device.
    act_bytes = max((s.forward_peak_bytes - s.start_bytes) for s in steps) if steps else 0
    if hints.params:
        weights = hints.params * hints.param_bytes / model_split
        grads = weights if training else 0.0
        opt = hints.params * hints.master_bytes / model_split / (par.dp if par.zero1 else 1) if training else 0.0
        # 1F1B keeps up to pp microbatches in flight on the first stage, each with 1/pp of the layers.
        activations = act_bytes / par.tp
        memory = weights + grads + opt + activations
    else:
        memory = max(s.peak_bytes for s in steps) / model_split if steps else 0.0
        weights = grads = opt = 0.0
        activations = memory
    flops = sum(s.total("flops") for s in steps) / nsteps
    model_flops = sum(s.total("flops", C.MATMUL) for s in steps) / nsteps
    train_flops = model_flops * m * par.dp  # optimizer matmuls are none; per global step
    dtype = hints.matmul_dtype or _main_dtype(steps)
    return {
        "step_s": step_s,
        "breakdown": breakdown,
        "mode": mode,
        "nodes": nodes,
        "devices": par.devices,
        "devices_paid": nodes * devices_per_node,
        "parallel": vars(par),
        "flops_per_step": flops * m * par.dp,
        "matmul_flops_per_step": train_flops,
        "tokens_per_step": tokens * m * par.dp,
        "samples_per_step": samples * m * par.dp,
        "audio_s_per_step": audio_s * m * par.dp,
        "dtype": dtype,
        "nki_ops": nki_ops,
        "memory": {"per_device_bytes": memory, "capacity_bytes": target.hbm_bytes, "weights": weights,
                   "gradients": grads, "optimizer": opt, "activations": activations,
                   "fits": memory <= target.hbm_bytes},
    }


def extrapolate_layers(t1: Dict[str, Any], t2: Dict[str, Any], n_layers: int) -> Dict[str, Any]:
    """Combine :func:`step_time` results of 1- and 2-layer counts into the ``n_layers`` result."""
    n = n_layers - 1

    def ext(a: float, b: float) -> float:
        return a + n * (b - a)

    out = dict(t2)
    keys = set(t1["breakdown"]) | set(t2["breakdown"])
    out["breakdown"] = {k: ext(t1["breakdown"].get(k, 0.0), t2["breakdown"].get(k, 0.0)) for k in keys}
    out["step_s"] = sum(out["breakdown"].values())
    for k in ("flops_per_step", "matmul_flops_per_step"):
        out[k] = ext(t1[k], t2[k])
    mem = dict(t2["memory"])
    mem["activations"] = ext(t1["memory"]["activations"], t2["memory"]["activations"])
    mem["per_device_bytes"] = mem["weights"] + mem["gradients"] + mem["optimizer"] + mem["activations"]
    mem["fits"] = mem["per_device_bytes"] <= mem["capacity_bytes"]
    out["memory"] = mem
    return out


def _main_dtype(steps: Sequence[C.StepCounts]) -> str:
    by: Dict[str, float] = {}
    for s in steps:
        for op in s.ops:
            if op.cls == C.MATMUL:
                by[op.dtype] = by.get(op.dtype, 0.0) + op.flops
    return max(by, key=by.get) if by else "float32"
