"""``nki.typing`` (``nt``): annotations of a kernel's tensor parameters.

``def kernel(a: nt.tensor[[128, 512], nl.float32], out: nt.mutable_tensor)`` runs unchanged. When a
kernel is called, a parameter annotated with a shape and dtype is checked against its argument
(a ``ValueError`` for another shape, a ``TypeError`` for another dtype or a non-tensor), the same
check AWS's tracer makes of an annotated parameter. ``nt.mutable_tensor`` marks a parameter the
kernel writes (an output the caller allocates); here every HBM argument is writable, so the
annotation is accepted and recorded (:func:`mutable_params`) but changes nothing else.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch

__all__ = ["tensor", "mutable_tensor", "mutable", "immutable", "TensorType", "param_types", "mutable_params"]


class TensorType:
    """An annotation of a tensor parameter: optional ``shape`` (None for any axis size given as None or
    ``...``), optional ``dtype``, and whether the kernel may write it (``mutable``)."""

    def __init__(self, shape: Optional[Tuple[Optional[int], ...]] = None, dtype: Any = None, mutable: bool = False):
        self.shape, self.dtype, self.mutable = shape, dtype, mutable

    def __getitem__(self, spec) -> "TensorType":
        """``nt.tensor[[128, 512], nl.float32]``, ``nt.tensor[nl.float32]`` or ``nt.tensor[[128, 512]]``."""
        from ._core import as_dtype

        parts = spec if isinstance(spec, tuple) else (spec,)
        shape, dtype, is_mutable = None, None, self.mutable
        # NKI's newer form lists the sizes themselves: nt.tensor[128, 512] (a shape list is the older one).
        sizes = [p for p in parts if _is_size(p)]
        if sizes:
            if len(sizes) != sum(1 for p in parts[:len(sizes)] if _is_size(p)):
                raise TypeError(f"nki.typing: a shape's sizes come first and together, got {spec!r}")
            parts = (list(sizes),) + tuple(p for p in parts if not _is_size(p))
        for p in parts:
            if p is mutable or p is immutable:
                is_mutable = p is mutable
                continue
            if isinstance(p, (list, tuple)):
                if shape is not None:
                    raise TypeError(f"nki.typing: two shapes in one annotation: {spec!r}")
                dims = []
                for d in p:
                    if d is None or d is Ellipsis:
                        dims.append(None)
                    elif isinstance(d, int) and not isinstance(d, bool) and d >= 0:
                        dims.append(int(d))
                    else:
                        raise TypeError(f"nki.typing: a shape's sizes are non-negative ints (or None for any), "
                                        f"got {d!r} in {list(p)}")
                shape = tuple(dims)
            else:
                if dtype is not None:
                    raise TypeError(f"nki.typing: two dtypes in one annotation: {spec!r}")
                dtype = as_dtype(p, "nki.typing annotation")
        return TensorType(shape, dtype, is_mutable)

    def placeholder(self, what: str) -> torch.Tensor:
        """A CPU tensor of zeros of this annotation's shape and dtype, for ``nki.benchmark``'s calls with
        annotations as arguments (AWS's benchmark uses the arguments' shapes and dtypes only)."""
        if self.shape is None or None in self.shape or self.dtype is None:
            raise TypeError(f"{what}: an nki.typing argument stands for an input only with a full shape and a "
                            f"dtype, got {self!r}")
        return torch.zeros(self.shape, dtype=self.dtype)

    def check(self, name: str, kernel: str, value) -> None:
        from ._core import HbmTensor

        if isinstance(value, HbmTensor):
            value = value.tensor
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{kernel}: parameter '{name}' is annotated {self!r}, a tensor, got "
                            f"{type(value).__name__}")
        if self.shape is not None:
            actual = tuple(value.shape)
            if len(actual) != len(self.shape) or any(w is not None and w != a for w, a in zip(self.shape, actual)):
                raise ValueError(f"{kernel}: parameter '{name}' is annotated with shape {list(self.shape)}, got a "
                                 f"tensor of shape {list(actual)}")
        if self.dtype is not None and value.dtype != self.dtype:
            raise TypeError(f"{kernel}: parameter '{name}' is annotated with dtype {self.dtype}, got a tensor of "
                            f"{value.dtype}")

    def __repr__(self) -> str:
        base = "nt.mutable_tensor" if self.mutable else "nt.tensor"
        parts = []
        if self.shape is not None:
            parts.append(str([d if d is not None else None for d in self.shape]))
        if self.dtype is not None:
            parts.append(str(self.dtype))
        return f"{base}[{', '.join(parts)}]" if parts else base


def _is_size(p) -> bool:
    return p is None or p is Ellipsis or (isinstance(p, int) and not isinstance(p, bool))


#: ``nt.tensor``: a tensor parameter the kernel reads; ``nt.tensor[shape, dtype]`` checks both.
tensor = TensorType()
#: ``nt.mutable_tensor``: a tensor parameter the kernel writes (an output the caller allocated).
mutable_tensor = TensorType(mutable=True)


def mutable(t: TensorType = tensor) -> TensorType:
    """``nt.mutable(nt.tensor[...])``: the same annotation, writable (also ``nt.tensor[nt.mutable]``)."""
    if not isinstance(t, TensorType):
        raise TypeError(f"nt.mutable takes an nki.typing tensor annotation, got {t!r}")
    return TensorType(t.shape, t.dtype, True)


def immutable(t: TensorType = tensor) -> TensorType:
    """``nt.immutable(nt.tensor[...])``: the same annotation, read-only."""
    if not isinstance(t, TensorType):
        raise TypeError(f"nt.immutable takes an nki.typing tensor annotation, got {t!r}")
    return TensorType(t.shape, t.dtype, False)


def param_types(fn: Callable) -> Dict[str, TensorType]:
    """The parameters of ``fn`` annotated with nki.typing, by name (string annotations, as under
    ``from __future__ import annotations``, are evaluated in the function's module)."""
    out: Dict[str, TensorType] = {}
    for name, ann in getattr(fn, "__annotations__", {}).items():
        if name == "return":
            continue
        if isinstance(ann, str):
            if "tensor" not in ann and "mutable" not in ann:
                continue
            try:
                ann = eval(ann, getattr(fn, "__globals__", {}))  # noqa: S307 (the kernel's own annotation)
            except Exception:  # an annotation naming something else (not nki.typing's): not ours to check
                continue
        if isinstance(ann, TensorType):
            out[name] = ann
    return out


def mutable_params(fn: Callable) -> Tuple[str, ...]:
    """The names of ``fn``'s parameters annotated ``nt.mutable_tensor`` (or ``nt.mutable(...)``)."""
    return tuple(n for n, t in param_types(fn).items() if t.mutable)


def check_call(fn: Callable, kernel: str, args, kwargs, types: Dict[str, TensorType]) -> None:
    """Check a call's arguments against the parameters' nki.typing annotations."""
    if not types:
        return
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{kernel}: {e}") from None
    for name, t in types.items():
        if name in bound.arguments:
            t.check(name, kernel, bound.arguments[name])
