"""Inductor for the neuron device: C++ kernels that read and write device memory directly.

The emulated NeuronCore keeps device memory in host memory, so a neuron
tensor's ``data_ptr()`` is a host address that a C++ kernel can use as it is.
This module therefore reuses Inductor's C++ code generator (``CppScheduling``)
and its Python wrapper, and only tells them how to allocate, guard and
synchronize on the neuron device.

Importing it registers, once:

* the kernel and wrapper code generators (``register_backend_for_device``),
* the wrapper's device calls (``register_device_op_overrides``),
* Dynamo's device interface (``register_interface_for_device``).

Nothing imports it at ``import torch``: Inductor looks up ``Scheduling``,
``PythonWrapperCodegen`` and ``CppWrapperCodegen`` on the device module
(``torch.neuron``) the first time it compiles. The first two load
:mod:`torchneuron.compile.registration`, which registers everything, this module's
code generators and the C++ wrapper of AOTInductor and ``cpp_wrapper=True``
(:mod:`torchneuron.compile.aoti`); ``torch.neuron`` has no ``CppWrapperCodegen``,
so Inductor keeps that registration, including the per-device config that
versions the cache keys.

Inductor decides a few things by asking whether a device is named ``"cpu"``.
For the neuron device it would take GPU paths that assume Triton, or that
suit a GPU but not kernels running on the host's cores; nine are avoided
here (see :data:`CODEGEN_PATCHES`, :data:`CONFIG`, :func:`_use_scatter_fallback`,
:func:`_cat`, :func:`_use_two_step_variance`, :func:`_get_constant_value`,
:func:`_pad_as_cat`, :func:`_is_cpu` and :func:`_make_reduction_inner`), so
that neuron kernels are the CPU's kernels. One of them made results wrong
(the index an argmax over a permuted tensor returns).

Neuron kernels also avoid one defect of Inductor's C++ generator (PyTorch
2.13): a 2-d tiled kernel that scatters with ``atomic_add`` (the gradient of a
max-pool whose offsets and gradient differ in layout, e.g. channels-last) adds
the tile offset to the outer loop variable twice and writes to wrong
addresses. :func:`_tile2d_store` passes that index on unshifted. And a
pointwise consumer of a FlexAttention kernel is not fused into the C++
template, which cannot render it (:meth:`Scheduling.can_fuse_vertical`). A
neuron ``flex_attention`` is lowered with the CPU's C++ template
(:mod:`torchneuron.compile.flex_attention`).
"""

from __future__ import annotations

import contextlib
import unittest.mock
from typing import Any

import torch
from torch._dynamo import device_interface as _di
from torch._inductor import config as inductor_config
from torch._inductor import decomposition as _inductor_decomposition
from torch._inductor import ir as _ir
from torch._inductor import lowering as _inductor_lowering
from torch._inductor import utils as _inductor_utils
from torch._inductor.codegen import common as _common
from torch._inductor.codegen import cpp as _cpp
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_flex_attention_template import CppFlexAttentionTemplate
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapperCodegen
from torch._inductor.virtualized import V

from .. import _patch
from .._patch import Patch, PatchSet
from . import _codegen_config, flex_attention
from .passes import ChannelsLastConvolutions

__all__ = ["Scheduling", "PythonWrapperCodegen", "CONFIG", "PATCHES", "neuron_compile", "register"]

DEVICE = "neuron"

# Inductor options in force while the scheduler fuses and generates a neuron
# graph. Inductor skips these loop transformations for "cpu" nodes because its
# C++ code generator has not been validated with them (reindexing even fails on
# C++ node groups); neuron kernels come from that same generator. They are set
# only between the creation of a neuron graph's wrapper and its generate()
# (GRAPH_PATCHES), so cache keys and other devices' compiles never see them.
CONFIG: dict[str, Any] = {
    "loop_ordering_after_fusion": False,
    "loop_reindexing_after_fusion": False,
    "loop_index_inversion_in_fusion": False,
}

_TILE2D_STORE = _cpp.CppTile2DKernel.store


def _tile2d_store(self, name, index, value, mode=None):
    """``CppTile2DKernel.store`` without the double shift of a vectorized ``atomic_add`` index.

    The tile kernel shifts the outer loop variable of a store's index by the
    tile offset and hands it to ``CppVecKernel.store``, whose ``atomic_add``
    turns the index into a value with ``ops.index_expr``, and the tile kernel's
    ``index_expr`` shifts it again. Such a store gets the index unshifted.
    """
    vectorized_atomic_add = mode == "atomic_add" and (inductor_config.cpp.dynamic_threads or self.num_threads != 1)
    if vectorized_atomic_add and not self.need_vec_transpose(self.rename_indexing(index)):
        return _cpp.CppVecKernel.store(self, name, index, value, mode)
    return _TILE2D_STORE(self, name, index, value, mode)


_USE_SCATTER_FALLBACK = _inductor_utils.use_scatter_fallback


def _use_scatter_fallback(op_overload, reduction_type, self_dtype, src_dtype, src_device_type, src_is_tensor):
    """Inductor's ``use_scatter_fallback``, answering for a neuron source as for a CPU one.

    With more than one thread Inductor leaves a CPU ``scatter_reduce_(sum)`` (the
    gradient of a max-pool, of an embedding) to ATen's kernel rather than
    generating one that adds atomically from every thread; for any other
    device it generates the atomic kernel, which on the host's cores took
    7.1 ms where the CPU's route took 3.7 ms (the small CNN's backward pass).
    """
    if src_device_type == DEVICE:
        src_device_type = "cpu"
    return _USE_SCATTER_FALLBACK(op_overload, reduction_type, self_dtype, src_dtype, src_device_type,
                                 src_is_tensor)


_CAT = _inductor_lowering.lowerings[torch.ops.aten.cat.default]


def _cat(inputs, dim=0):
    """Inductor's lowering of ``aten.cat``, lowering a neuron concatenation as a CPU one.

    For the CPU Inductor always copies each input into its slice of the output
    (``ConcatKernel``: vectorized copies); for other devices it may compute the
    output in one kernel that selects an input per element, which its C++
    generator cannot vectorize: 1.23 ms where the copies take 0.41 ms (the
    small GPT's backward, q/k/v gradients into one). Neuron graphs get the
    copies, by turning the pointwise form off for this call.
    """
    if inputs and inputs[0].get_device().type == DEVICE:
        with inductor_config.patch(max_pointwise_cat_inputs=0, max_complex_pointwise_cat_inputs=0):
            return _CAT(inputs, dim)
    return _CAT(inputs, dim)


_IS_CPU = _ir.is_cpu


def _is_cpu(x) -> bool:
    """Inductor's ``ir.is_cpu``, answering True for a neuron node too.

    Inductor asks it only for heuristics: when a pointwise node that is read
    many times, or by a heavy consumer, is computed once into a buffer rather
    than inlined into each reader (``realize_cpu_opcount_threshold``,
    ``realize_cpu_acc_reads_threshold``, ``should_realize_on_reuse``). The GPU's
    thresholds assume kernels that recompute cheaply on thousands of threads;
    neuron kernels run on the host's cores, like the CPU's.
    """
    return _IS_CPU(x) or _ir.get_device_type(x) == DEVICE


_USE_TWO_STEP_VARIANCE = _inductor_lowering.use_two_step_variance


def _use_two_step_variance(x, axis, keepdim, input_dtype) -> bool:
    """Inductor's choice between a two-pass variance and Welford's, made for a neuron input as for a CPU one.

    The CPU takes the two-pass form up to ``config.cpp.use_two_step_variance_threshold``
    elements (1024: every LayerNorm of a small transformer); any other device
    only up to ``config.unroll_reductions_threshold`` (8), so a neuron
    LayerNorm would run Welford's update per element. For a neuron input the
    rule runs with the CPU's threshold in that place.
    """
    if _ir.get_device_type(x) == DEVICE:
        with inductor_config.patch(unroll_reductions_threshold=inductor_config.cpp.use_two_step_variance_threshold):
            return _USE_TWO_STEP_VARIANCE(x, axis, keepdim, input_dtype)
    return _USE_TWO_STEP_VARIANCE(x, axis, keepdim, input_dtype)


_GET_CONSTANT_VALUE = _inductor_lowering.get_constant_value


def _get_constant_value(x):
    """Inductor's ``get_constant_value``, answering no constant for a neuron node.

    Its one use outside the CPU's oneDNN lowerings is ``prims.div``: a division by
    a constant becomes a multiplication by the reciprocal on every device but
    the CPU, whose results would then differ from eager's in the last bit
    (pytorch/pytorch#157959). Neuron graphs keep the division, as CPU graphs do.
    """
    if _ir.get_device_type(x) == DEVICE:
        return None
    return _GET_CONSTANT_VALUE(x)


_PAD_AS_CAT = _inductor_lowering._pad_as_cat


def _pad_as_cat(x, padding, fill_value):
    """Inductor's padding-as-concatenation, declined for a neuron input as for a CPU one.

    A right-pad lowered as ``cat([x, fill])`` suits a GPU, where the
    concatenation is one pointwise kernel; neuron concatenations are
    ``ConcatKernel`` copies (:func:`_cat`), so the pad stays one pointwise kernel.
    """
    if _ir.get_device_type(x) == DEVICE:
        return None
    return _PAD_AS_CAT(x, padding, fill_value)


_MAKE_REDUCTION_INNER = _inductor_lowering._make_reduction_inner
_ARG_REDUCTIONS = frozenset(("argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value",
                             "argmin_with_value"))


def _make_reduction_inner(x, **kwargs):
    """Inductor's reduction set-up, numbering an arg-reduction's result for a neuron input as for a CPU one.

    An argmax/argmin over several dimensions of a permuted or strided tensor
    walks them in memory order; Inductor turns the position back into the
    logical index only for Triton and the CPU's C++ backend, and for any other
    device returns the position in memory: ``argmax(x.permute(2, 0, 1))`` of a
    6x5x7 tensor gave 55 where eager gave 187. For a neuron input the rule runs
    as for those backends (its ``is_triton`` check answers True for this call only).
    """
    if _ir.get_device_type(x) == DEVICE and kwargs.get("reduction_type") in _ARG_REDUCTIONS:
        with unittest.mock.patch.object(_inductor_lowering, "is_triton", lambda _node: True):
            return _MAKE_REDUCTION_INNER(x, **kwargs)
    return _MAKE_REDUCTION_INNER(x, **kwargs)


class Scheduling(CppScheduling):
    """Inductor's C++ kernel generation for the neuron device (kernels address device memory directly)."""

    def codegen_node(self, node):  # noqa: D102
        with CODEGEN_PATCHES.scope():
            return super().codegen_node(node)

    def can_fuse_vertical(self, node1, node2):
        """The CPU's rule, except that nothing is fused after a FlexAttention kernel.

        PyTorch 2.13 fuses a pointwise consumer into the C++ FlexAttention
        template (``flex_attention(...).relu()``), whose ``render`` then raises
        "Unsupported for `epilogue_nodes` in CppFlexAttentionTemplate"; CPU
        compiles fail that way. Neuron graphs keep the consumer a kernel of its own.
        """
        template = node1.get_template_node() if node1.is_template() else None
        if isinstance(getattr(template, "template", None), CppFlexAttentionTemplate):
            return False
        return super().can_fuse_vertical(node1, node2)

    def codegen_template(self, *args, **kwargs):  # noqa: D102
        with CODEGEN_PATCHES.scope():
            return super().codegen_template(*args, **kwargs)

    def flush(self):  # noqa: D102
        with CODEGEN_PATCHES.scope():
            return super().flush()


class NeuronPythonWrapperCodegen(_PythonWrapperCodegen):
    """Inductor's Python wrapper for neuron graphs: allocates device buffers and calls the C++ kernels.

    Inductor creates it before scheduling a neuron graph and calls generate()
    last, so it also scopes :data:`GRAPH_PATCHES` to that graph (and ends a
    compile scope that the graph's device pass opened; see :func:`neuron_compile`).
    """

    def __init__(self) -> None:
        super().__init__()
        begin_graph()

    def generate(self, is_inference):  # noqa: D102
        try:
            return super().generate(is_inference)
        finally:
            end_graph()

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):  # noqa: D102
        if is_subgraph:
            # Subgraphs (e.g. of control flow ops) use the generic subgraph wrapper.
            return _PythonWrapperCodegen.create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures)
        return NeuronPythonWrapperCodegen()

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        # Inductor emits no device guard for devices it does not know as GPUs, so name the
        # device index: buffers of a graph on neuron:1 must not land on the current device.
        if device.type != DEVICE or is_pinned or torch._inductor.config.test_configs.track_memory_lifecycle:
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        shape_code = self.codegen_python_shape_tuple(shape)
        alloc_code = self.codegen_python_shape_tuple(allocation_shape if allocation_shape is not None else shape)
        stride_code = self.codegen_python_shape_tuple(stride)
        index = device.index if device.index is not None else 0
        out = f"{name} = empty_strided_neuron({alloc_code}, {stride_code}, {dtype}, {index})"
        if alloc_code != shape_code:
            out += f".as_strided({shape_code}, {stride_code})"
        return out

    def codegen_input_size_asserts(self) -> None:  # noqa: D102
        if _codegen_config.forward_input_asserts or V.graph.is_backward:
            super().codegen_input_size_asserts()

    def write_header(self) -> None:  # noqa: D102
        super().write_header()
        # Buffers come from the device allocator without torch.empty_strided's parsing and dispatch
        # (the CPU's wrapper has empty_strided_cpu for the same reason).
        self.header.writeline("from torchneuron._C import _empty_strided as empty_strided_neuron")
        self.header.writeline("from torchneuron._C import _launch as launch_neuron_kernel")

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        # C++ kernels are plain functions over data pointers, called through the runtime as work of
        # the graph's device (launch_neuron_kernel(name, device, kernel, *args)), like eager kernels.
        if not triton:
            index = device.index if device is not None and device.index is not None else min(V.graph.device_idxs, default=0)
            args = "".join(f", {arg}" for arg in call_args)
            self.writeline(f"launch_neuron_kernel({kernel_name!r}, {index}, {kernel_name}{args}){self.ending}")
            return
        return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class NeuronDeviceOpOverrides(_common.DeviceOpOverrides):
    """Python and C++ snippets the wrapper emits for device guards, streams and synchronization."""

    def import_get_raw_stream_as(self, name: str) -> str:  # noqa: D102
        return f"def {name}(_):\n    return 0\n"

    def set_device(self, device_idx: int) -> str:  # noqa: D102
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:  # noqa: D102
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:  # noqa: D102
        return f"torch.neuron.device({device_idx})"

    def current_stream(self) -> str:  # noqa: D102
        return "torch.neuron.current_stream()"

    def cpp_kernel_type(self) -> str:  # noqa: D102
        return "void*"

    def cpp_device_guard(self) -> str:  # noqa: D102
        return "c10::DeviceGuard"

    def cpp_stream_guard(self) -> str:  # noqa: D102
        return "c10::StreamGuard"


class NeuronInterface(_di.DeviceInterface):
    """Dynamo's view of the neuron device (streams, events, properties)."""

    device = torch.neuron.device  # type: ignore[assignment]
    Event = torch.Event  # type: ignore[assignment]
    Stream = torch.Stream  # type: ignore[assignment]

    class Worker:  # noqa: D106
        @staticmethod
        def set_device(device: int) -> None:
            _di.caching_worker_current_devices[DEVICE] = device

        @staticmethod
        def current_device() -> int:
            return _di.caching_worker_current_devices.get(DEVICE, torch.neuron.current_device())

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            return torch.neuron.get_device_properties(device)

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    stream = staticmethod(torch.neuron.stream)  # type: ignore[assignment]
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(torch.neuron.synchronize)
    get_device_properties = staticmethod(torch.neuron.get_device_properties)  # type: ignore[assignment]
    memory_allocated = staticmethod(torch.neuron.memory_allocated)
    is_bf16_supported = staticmethod(torch.neuron.is_bf16_supported)  # type: ignore[arg-type]

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.neuron.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                             device_type=device_type))

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.neuron.current_device()
        if device >= 0 and device != previous:
            torch.neuron.set_device(device)
        return previous

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return NeuronInterface.exchange_device(device)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def is_available() -> bool:
        return torch.neuron.is_available()

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return ""

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False


# ---------------------------------------------------------------------------------------------
# Inductor's changes for neuron graphs: listed, applied only while a neuron graph compiles
# ---------------------------------------------------------------------------------------------

def _cat_overloads() -> list[Any]:
    return [op for op, lowering in _inductor_lowering.lowerings.items() if lowering is _CAT]


_TORCH_INDUCTOR = "torch._inductor"

#: In force while a neuron graph is compiled (decompositions, lowering, scheduling). Each replacement
#: answers for a neuron node as the CPU's rule would and defers to PyTorch's function otherwise.
#: Module functions are replaced wherever Inductor's modules bound them (``from .utils import ...``).
COMPILE_PATCHES = PatchSet("neuron compile", (
    _patch.attribute(_inductor_utils, "use_scatter_fallback", lambda _: _use_scatter_fallback,
                     "a neuron scatter-reduce falls back to ATen as a CPU one does (not atomic adds)",
                     bindings=_TORCH_INDUCTOR),
    _patch.attribute(_ir, "is_cpu", lambda _: _is_cpu,
                     "neuron nodes take the CPU's realize-on-reuse thresholds", bindings=_TORCH_INDUCTOR),
    _patch.attribute(_inductor_lowering, "use_two_step_variance", lambda _: _use_two_step_variance,
                     "neuron variances take the CPU's two-pass threshold", bindings=_TORCH_INDUCTOR),
    _patch.attribute(_inductor_lowering, "get_constant_value", lambda _: _get_constant_value,
                     "a neuron division by a constant stays a division, as on the CPU",
                     bindings=_TORCH_INDUCTOR),
    _patch.attribute(_inductor_lowering, "_pad_as_cat", lambda _: _pad_as_cat,
                     "a neuron pad stays one pointwise kernel", bindings=_TORCH_INDUCTOR),
    _patch.attribute(_inductor_lowering, "_make_reduction_inner", lambda _: _make_reduction_inner,
                     "a neuron argmax/argmin over several dimensions returns the logical index",
                     bindings=_TORCH_INDUCTOR),
    _patch.item(_inductor_lowering.lowerings, _cat_overloads, lambda _: _cat,
                "a neuron concatenation is lowered as copies into the output (ConcatKernel), as on the CPU",
                target="torch._inductor.lowering.lowerings[aten.cat]"),
    flex_attention.INDUCTOR_PATCH,
))

#: In force from the creation of a neuron graph's wrapper to the end of its generate().
GRAPH_PATCHES = PatchSet("neuron graph", (
    _patch.config(inductor_config, CONFIG, "loop transformations the C++ generator is not validated with, off"),
))

#: In force while the C++ kernels of a neuron graph are generated.
CODEGEN_PATCHES = PatchSet("neuron kernel generation", (
    _patch.attribute(_cpp.CppTile2DKernel, "store", lambda _: _tile2d_store,
                     "a vectorized atomic_add store of a 2-d tile kernel gets its index shifted once",
                     target="torch._inductor.codegen.cpp.CppTile2DKernel.store"),
    _patch.Replacement(_patch.Patch("torch._inductor.config.cuda_backend",
                                    "get_current_backend answers config.cpu_backend for neuron kernels"),
                       lambda: _cuda_backend_as_cpu()),
))

#: Every change Inductor gets for neuron graphs, in the order the scopes nest.
PATCHES: tuple[Patch, ...] = COMPILE_PATCHES.patches + GRAPH_PATCHES.patches + CODEGEN_PATCHES.patches


def _cuda_backend_as_cpu():
    patch = inductor_config.patch(cuda_backend=inductor_config.cpu_backend)
    patch.__enter__()
    return lambda: patch.__exit__(None, None, None)


_opened = False  # COMPILE_PATCHES was applied by a neuron graph's device pass (default backend)


@contextlib.contextmanager
def neuron_compile():
    """Context manager: Inductor's changes for neuron graphs in force inside, undone when it ends.

    ``backend="neuron"`` compiles inside it (the whole ``compile_fx``, and each
    graph compiled later, such as a backward graph AOTAutograd compiles at the
    first backward call). Under the default backend, the neuron graph's device
    pass (:class:`_NeuronGraphPass`, run before lowering) applies the changes, and
    they end with the graph's code generation, or with the compile, whichever
    comes first: Dynamo's end-of-compile callback runs in a ``finally`` also
    when a compile fails half-way.
    """
    COMPILE_PATCHES.apply()
    try:
        yield
    finally:
        GRAPH_PATCHES.reset()
        CODEGEN_PATCHES.reset()
        COMPILE_PATCHES.undo()


def _open_scope() -> None:
    global _opened
    if not COMPILE_PATCHES.active:
        COMPILE_PATCHES.apply()
        _opened = True


def begin_graph() -> None:
    """A neuron graph's wrapper (Python or C++) was created: its settings (GRAPH_PATCHES) apply until end_graph()."""
    GRAPH_PATCHES.reset()  # a graph that failed half-way outside any compile scope
    GRAPH_PATCHES.apply()


def end_graph(*_: Any) -> None:
    """A neuron graph's code is generated, or a compile ended (also a failed one): its settings end, and so
    does the compile scope its device pass opened (not one neuron_compile() holds)."""
    global _opened
    GRAPH_PATCHES.reset()
    CODEGEN_PATCHES.reset()
    if _opened:
        _opened = False
        COMPILE_PATCHES.undo()


class NeuronGraphPass(ChannelsLastConvolutions):
    """The neuron graph pass Inductor runs after AOTAutograd, before lowering: it begins the compile scope."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        _open_scope()
        return super().__call__(gm)


# The names Inductor's init_backend_registration looks up on torch.neuron.
PythonWrapperCodegen = NeuronPythonWrapperCodegen
