"""NKI's two calling forms of an instruction: the current one names the destination tile first
(``nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)``), the earlier one returns a new tile
(``c = nisa.tensor_tensor(a, b, op=nl.add)``)."""

from __future__ import annotations

import math

import torch

from ._core import Tile, TileView, _get, fail, sbuf, write

_TILE = (Tile, TileView)


def _split_dst(args, kwargs, slots, what: str):
    """(dst, remaining positional args) for both of NKI's calling forms.

    ``slots`` are the earlier (dst-less) form's parameters as (name, kind), kind "tile" (a tile),
    "any" (a tile or a scalar) or "other" (an op, an axis, a flag, an index expression). The NKI 0.6
    form puts the output tile first (``dst``, positional or by keyword). A first positional tile is
    that ``dst`` when the earlier form cannot take the arguments: a tile would land in a non-tile
    parameter (an op), or there are more positional arguments than free parameters.
    """
    if "dst" in kwargs:
        return kwargs.pop("dst"), list(args)
    if not args or not isinstance(args[0], _TILE):
        return None, list(args)
    free = [kind for name, kind in slots if name not in kwargs]
    if len(args) > len(free):
        return args[0], list(args[1:])
    if free and free[0] == "other":  # the earlier form starts with an op / an expression, never a tile
        return args[0], list(args[1:])
    if any(isinstance(a, _TILE) and kind == "other" for a, kind in zip(args, free)):
        return args[0], list(args[1:])
    return None, list(args)


def _take(rest, kwargs, names):
    out = []
    for n in names:
        if rest:
            out.append(rest.pop(0))
        elif n in kwargs:
            out.append(kwargs.pop(n))
        else:
            out.append(None)
    return out


def _deliver(dst, value: torch.Tensor, what: str, dtype=None, buffer=sbuf, mask=None, valid=None):
    if dst is None:
        dst = Tile(value.shape, dtype if dtype is not None else value.dtype, buffer)
    elif isinstance(dst, _TILE):  # NKI 0.6: the result goes into dst, in dst's dtype and buffer
        target = tuple(_get(dst.tile.data, dst.index).shape)
        got = tuple(value.shape)
        if got != target:
            if value.numel() != math.prod(target) or \
                    [n for n in got if n != 1] != [n for n in target if n != 1]:
                fail(ValueError, f"{what}: the result has shape {got} but dst has shape {target}")
            value = value.reshape(target)
            if valid is not None and valid.numel() == value.numel():
                valid = valid.reshape(target)
    write(dst, value, what, mask, valid=valid)
    return dst


def _required(what: str, **values):
    """A TypeError naming the first required parameter that was not given."""
    for name, value in values.items():
        if value is None:
            fail(TypeError, f"{what}: missing the argument {name!r}")
