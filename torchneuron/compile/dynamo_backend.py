"""The Dynamo backend ``"neuron"``: Inductor with the neuron registration, neuron's modes and diagnostics.

``torch.compile(model, backend="neuron")`` finds this backend through the
``torch_dynamo_backends`` entry point, so nothing is imported before the
first compile. The backend runs Inductor's whole pipeline (AOTAutograd for
training, decompositions, fusion, the FX graph and AOTAutograd caches) and
generates C++ kernels that work on neuron device memory in place.

Both entry points share the device's registration (its graph pass included,
see :mod:`torchneuron.compile.passes`). On top of it this backend maps the
modes (:func:`options_for`) and adds

* :data:`NEURON_CONFIG`, the neuron code generator's own settings: a forward
  graph does not check its inputs' sizes and strides again, because Dynamo's
  guards have just checked them (graphs AOTAutograd feeds itself, the
  backward ones, keep their checks).

Other candidates are left out: CUDA graphs do not exist for the device
(``cpp_wrapper=True`` is accepted as on the default backend, see
:mod:`torchneuron.compile.aoti`), ``freezing`` bakes parameters into inference graphs, and
``size_asserts=False`` also drops the checks that a device kernel's output
strides match its meta function's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import _cache, _codegen_config, diagnostics

__all__ = ["neuron", "MODES", "OPTIONS", "NEURON_CONFIG"]

# Inductor options of backend="neuron" on top of Inductor's defaults (see options_for).
OPTIONS: dict[str, Any] = {}

# Neuron code generation settings of backend="neuron" (torchneuron.compile._codegen_config). Inputs of
# a forward graph are not checked again inside the graph: Dynamo's guards have checked their sizes
# and strides before the call (about 1 us per input saved; 50 inputs on the small GPT).
NEURON_CONFIG: dict[str, Any] = {"forward_input_asserts": False}

# What each torch.compile mode means on neuron. Nothing here uses CUDA graphs:
# there are none on the device, and its kernels already run on the host thread.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
    "max-autotune": {"max_autotune": True},
}


def options_for(mode: str | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the Inductor options a neuron compile uses for ``mode`` and user ``options``.

    Args:
        mode: a ``torch.compile`` mode name, or None for "default".
        options: Inductor options given to ``torch.compile``; they win over the mode's.
    """
    mode = mode or "default"
    if mode not in MODES:
        raise RuntimeError(f"Unrecognized mode={mode!r} for backend='neuron'; use one of {', '.join(MODES)}")
    patches = {**OPTIONS, **MODES[mode]}
    for key, value in (options or {}).items():
        patches[key.replace("-", "_")] = value
    return patches


def neuron(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
           options: dict[str, Any] | None = None):
    """Compile a Dynamo graph for the neuron device with Inductor.

    Args:
        gm: the FX graph Dynamo captured.
        example_inputs: its example inputs (fake tensors).
        mode: the ``torch.compile`` mode; see :data:`MODES`.
        options: extra Inductor options, as for the default backend.
    """
    _cache.apply()
    from . import inductor, registration  # registration: Inductor's, for the device

    registration.register()
    diagnostics.install()
    from torch._inductor.compile_fx import compile_fx

    patches = options_for(mode, options)
    from torch._inductor import config as inductor_config

    known = inductor_config.get_config_copy()
    unknown = [k for k in patches if k not in known]
    if unknown:
        raise RuntimeError(f"Unexpected optimization option(s) {unknown} for backend='neuron'")
    with _codegen_config.patch(NEURON_CONFIG), inductor.neuron_compile():
        return compile_fx(gm, example_inputs, config_patches=patches, inner_compile=_inner_compile)


def _inner_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """Inductor's ``compile_fx_inner`` inside the neuron compile scope (backward graphs compile later, at the
    first backward call, outside :func:`neuron`)."""
    from torch._inductor.compile_fx import compile_fx_inner

    from . import inductor

    with inductor.neuron_compile():
        return compile_fx_inner(gm, example_inputs, **kwargs)
