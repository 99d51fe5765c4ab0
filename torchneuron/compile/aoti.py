"""Inductor's C++ wrapper for neuron graphs: AOTInductor packages and ``cpp_wrapper=True``.

``torch._inductor.aoti_compile_and_package`` and ``torch.compile(...,
options={"cpp_wrapper": True})`` generate the graph's host code in C++
instead of Python. Inductor's C++ wrapper (``CppWrapperCpu``) knows its
devices by a fixed table (``DEVICE_TO_ATEN``: cpu, cuda, xpu, mps, meta), so
a neuron graph failed with "neuron not found in DEVICE_TO_ATEN".
:class:`NeuronCppWrapper` is the C++ wrapper registered for the neuron
device (``register_backend_for_device``'s C++ wrapper slot); it leaves that
table alone and says, in the code it generates, what a neuron graph needs:

* the device: PyTorch's C shim knows the PrivateUse1 device type
  (``aoti_torch_device_type_privateuse1``), so neuron buffers are allocated
  with ``aoti_torch_empty_strided(..., privateuse1, index)``, through the
  device's allocator;
* the host code: neuron kernels are the CPU's C++ kernels over device memory
  (:mod:`torchneuron.compile.inductor`), so the wrapper includes the CPU's
  headers, vectorizes for the host, calls the CPU's C shim for the ops
  Inductor leaves to ATen, and is built as host code (a ``.so`` the CPU runner
  of ``aoti_load_package`` loads, ``AOTI_DEVICE_KEY`` "cpu");
* the weights: AOTInductor loads a package's weights into host memory (its
  runtime allocates device memory only for CUDA, XPU and MPS), and a neuron
  tensor must live in device memory, so the generated model loads them as
  host tensors and its first run copies them to the graph's device (an
  ordinary host-to-device copy), where they stay.

Building the wrapper as host code is the one change to Inductor:
``AotCodeCompiler.compile`` is given ``device_type="cpu"`` for a neuron
graph (:data:`BUILD_PATCHES`, in force from the creation of a neuron graph's
C++ wrapper to the end of that graph's build; any other device's graph is
built unchanged, also while it is in force).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch._inductor import codecache as _codecache
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.virtualized import V

from .._patch import Patch, PatchSet, Replacement
from . import inductor

__all__ = ["NeuronCppWrapper", "BUILD_PATCHES", "PATCHES"]

log = logging.getLogger("torchneuron")

DEVICE = "neuron"
# The PrivateUse1 device type as PyTorch's C shim names it (aoti_torch_device_type_privateuse1).
_SHIM_DEVICE = "privateuse1"


def _build_as_host_code() -> Any:
    """Replace ``AotCodeCompiler.compile`` by one that builds a neuron graph's wrapper as host (CPU) code."""
    owner = _codecache.AotCodeCompiler
    original = owner.__dict__["compile"]  # the classmethod itself, put back as it was
    compile_fn = original.__func__

    def compile(cls, *args: Any, device_type: str, **kwargs: Any) -> Any:
        if device_type.split(":", 1)[0] != DEVICE:
            return compile_fn(cls, *args, device_type=device_type, **kwargs)
        try:
            return compile_fn(cls, *args, device_type="cpu", **kwargs)
        finally:
            BUILD_PATCHES.reset()  # the neuron graph is built: its scope ends

    replacement = classmethod(compile)
    setattr(owner, "compile", replacement)

    def undo() -> None:
        if owner.__dict__.get("compile") is replacement:
            setattr(owner, "compile", original)

    return undo


#: In force from the creation of a neuron graph's AOTInductor wrapper to the end of its build.
BUILD_PATCHES = PatchSet("neuron AOTInductor build", (
    Replacement(Patch("torch._inductor.codecache.AotCodeCompiler.compile",
                      "a neuron graph's C++ wrapper and kernels are built as host code (device_type 'cpu'), "
                      "which the CPU runner of aoti_load_package loads"),
                _build_as_host_code),
))

#: Every change this module makes to Inductor.
PATCHES: tuple[Patch, ...] = BUILD_PATCHES.patches


def _graph_device_index() -> int:
    return min(V.graph.device_idxs, default=0)


class NeuronCppWrapper(CppWrapperCpu):
    """Inductor's C++ wrapper for neuron graphs (AOTInductor and ``cpp_wrapper=True``).

    Created before a neuron graph is scheduled and generated last, like the
    Python wrapper, it also scopes the neuron graph's Inductor settings
    (:data:`torchneuron.compile.inductor.GRAPH_PATCHES`, through ``begin_graph``/``end_graph``) to that graph.
    """

    def __init__(self) -> None:
        self.device = DEVICE
        super().__init__()
        self.needs_vec_isa = True  # neuron kernels are vectorized host code, as the CPU's
        self._host_constants = False  # while the model's constants are described (loaded on the host)
        inductor.begin_graph()
        if V.graph.aot_mode and not V.graph.is_const_graph:
            BUILD_PATCHES.reset()
            BUILD_PATCHES.apply()

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):  # noqa: D102
        # Inductor's C++ wrapper generates no subgraphs of its own (CppWrapperCpu.create ignores them too).
        return NeuronCppWrapper()

    def generate(self, is_inference):  # noqa: D102
        try:
            return super().generate(is_inference)
        except BaseException:
            BUILD_PATCHES.reset()
            raise
        finally:
            inductor.end_graph()

    # ---- the device ---------------------------------------------------------------------------

    def codegen_device(self, device: torch.device) -> str:
        """A device as the C shim's (type, index) pair; neuron is the shim's PrivateUse1 type."""
        if device.type != DEVICE:
            return super().codegen_device(device)
        if self._host_constants:
            return super().codegen_device(torch.device("cpu"))
        self.used_cached_devices.add(_SHIM_DEVICE)
        return f"cached_torch_device_type_{_SHIM_DEVICE}, {device.index if device.index is not None else 0}"

    def add_device_include(self, device: str) -> None:  # noqa: D102
        # Neuron kernels and the ops Inductor leaves to ATen use the CPU's headers and C shim.
        super().add_device_include("cpu" if device == DEVICE else device)

    @staticmethod
    def get_c_shim_func_name(kernel: str, device: str) -> str:
        """The C shim function of an op Inductor leaves to ATen: the CPU's for a neuron graph."""
        return CppWrapperCpu.get_c_shim_func_name(kernel, "cpu" if device == DEVICE else device)

    # ---- the weights --------------------------------------------------------------------------

    def codegen_model_constructor(self) -> None:
        """The model's constructor: its constants described as host tensors (AOTInductor loads them there)."""
        self._host_constants = True
        try:
            super().codegen_model_constructor()
        finally:
            self._host_constants = False
        # The device the model's buffers are allocated on: the graph's (the runner passes "cpu").
        lines = self.prefix._lines
        if not lines or lines[-1] != "}":
            raise RuntimeError("neuron AOTInductor: the model constructor Inductor generated does not end "
                               f"as expected ({lines[-1] if lines else 'empty'!r}); this PyTorch version is "
                               "not supported")
        lines.pop()
        with self.prefix.indent():
            self.prefix.writeline(f"device_idx_ = {_graph_device_index()};")
        self.prefix.writeline("}")

    def _write_input_unpacking(self) -> None:
        super()._write_input_unpacking()
        if not V.graph.aot_mode or V.graph.is_const_graph:
            return
        # A packaged model checks that each tensor input is on its device: its kernels address memory
        # directly, and a tensor of another device would be read as if it were device memory.
        self.used_cached_devices.add(_SHIM_DEVICE)
        for idx, (name, value) in enumerate(V.graph.graph_inputs.items()):
            device = value.get_device() if hasattr(value, "get_device") else None
            if device is None or device.type != DEVICE:
                continue
            self.prefix.splice(
                f"""
                {{
                    int32_t device_type, device_index;
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type({name}, &device_type));
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index({name}, &device_index));
                    if (device_type != cached_torch_device_type_{_SHIM_DEVICE} || device_index != device_idx_) {{
                        throw std::runtime_error("input {idx} of this model must be a tensor on neuron:" +
                            std::to_string(device_idx_) + " (the device it was compiled for); move it there "
                            "with .to(\\"neuron:" + std::to_string(device_idx_) + "\\")");
                    }}
                }}
                """
            )

    def _write_constants_unpacking(self) -> None:
        if V.graph.aot_mode and not V.graph.is_const_graph and V.graph.constants:
            self._write_constants_to_device()
        super()._write_constants_unpacking()

    def _write_constants_to_device(self) -> None:
        # device_type_ is the CPU's while the weights are host tensors (AOTInductor loaded them so), and
        # PrivateUse1 once they are on the device: the first run copies each into device memory.
        self.used_cached_devices.add(_SHIM_DEVICE)
        self.prefix.splice(
            f"""
            if (device_type_ != cached_torch_device_type_{_SHIM_DEVICE}) {{
                // neuron: the weights move from host memory (where AOTInductor loaded them) to the device.
                for (auto& entry : *constants_map_) {{
                    AtenTensorHandle host = entry.second.get();
                    int32_t device_type;
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(host, &device_type));
                    if (device_type == cached_torch_device_type_{_SHIM_DEVICE}) continue;
                    int64_t ndim, *sizes, *strides;
                    int32_t dtype;
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(host, &ndim));
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_sizes(host, &sizes));
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_strides(host, &strides));
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(host, &dtype));
                    AtenTensorHandle device;
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
                        ndim, sizes, strides, dtype, cached_torch_device_type_{_SHIM_DEVICE}, device_idx_, &device));
                    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(device, host, 0));
                    entry.second = MaybeOwningAtenTensorHandle(device);
                }}
                update_constants_array_from_map();
                device_type_ = cached_torch_device_type_{_SHIM_DEVICE};
            }}
            """
        )

    # ---- each C++ kernel as one launch on the device ------------------------------------------

    def write_header(self) -> None:  # noqa: D102
        super().write_header()
        # A kernel call is a lambda; torchneuron's _launch_host_code op runs it as a kernel of the
        # device's current stream (after earlier work, with device memory open in strict mode).
        self.header.splice(
            """
            template <class Body>
            static void neuron_launch_host_code(int64_t device, Body& body) {
                void (*trampoline)(void*) = [](void* p) { (*static_cast<Body*>(p))(); };
                StableIValue stack[3];
                int64_t args[3] = {device, static_cast<int64_t>(reinterpret_cast<uintptr_t>(trampoline)),
                                   static_cast<int64_t>(reinterpret_cast<uintptr_t>(&body))};
                std::memcpy(stack, args, sizeof(args));
                AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_call_dispatcher("torchneuron::_launch_host_code", "", stack));
            }
            """
        )

    def wrap_kernel_call(self, name, call_args):  # noqa: D102
        # Each of Inductor's C++ kernels is one launch (extern ops launch by themselves through the
        # dispatcher): it runs after the stream's earlier work, asynchronous ops included, and in
        # strict mode with device memory open only while it runs.
        call = super().wrap_kernel_call(name, call_args)
        return f"{{ auto neuron_kernel = [&]() {{ {call} }}; neuron_launch_host_code({self._neuron_device_expr()}, neuron_kernel); }}"

    def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs) -> None:  # noqa: D102
        # The CPU's C shim runs the CPU's kernel directly over device memory: one launch, like a
        # C++ kernel of the graph.
        if device != DEVICE:
            return super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)
        body: list = []
        self.writelines = body.extend  # the call's lines, caught to be written inside the launch
        try:
            super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)
        finally:
            del self.writelines
        self.writelines(["{ auto neuron_kernel = [&]() {", *body,
                         f"}}; neuron_launch_host_code({self._neuron_device_expr()}, neuron_kernel); }}"])

    @staticmethod
    def _neuron_device_expr() -> str:
        return "device_idx_" if V.graph.aot_mode else str(_graph_device_index())

    # ---- cpp_wrapper=True (the wrapper loaded as a Python extension) --------------------------

    def _generate_end_jit(self, result) -> None:  # noqa: D102
        # The extension is host code: CppWrapperCodeCache builds it as the CPU's (headers, flags).
        self.device = "cpu"
        try:
            super()._generate_end_jit(result)
        finally:
            self.device = DEVICE
