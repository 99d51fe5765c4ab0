"""A kernel traced once per shape, then replayed as one compiled graph.

The interpreter (the ``nl``/``nisa`` functions) runs a kernel instruction by instruction, with its checks
and its bookkeeping (which elements were written, what each instruction costs, which tiles are live).
For the same kernel called again with tensors of the same sizes, strides and dtypes, the same grid and
target and the same other arguments (constants), all of that comes out the same: only the data differs.
So the second such call runs the interpreter under ``make_fx``, which records the aten ops it does on the
data as one FX graph, and compiles the graph with Inductor, as fused eager does
(:func:`torchneuron.compile.dynamo_backend.neuron`); later calls run the compiled graph, and reuse the
:class:`KernelCall` (instructions, estimates, SBUF/PSUM peaks) of the interpreted run.

Before compiling, the graph is prepared so that its replay equals the interpreter bit for bit:

* what does not depend on the kernel's inputs (index expressions, masks, gather indices) is computed
  once and kept as constants; a boolean-mask index becomes the integer indices it selects;
* ops whose result Inductor would compute differently from ATen's kernel (reductions, whose order of
  additions differs, transcendentals, matrix products) run as ATen's own kernels inside the graph
  (custom ops Inductor cannot look into); additions, products, divisions (neuron's Inductor keeps a
  division by a constant a division), copies and the like are fused; so is ``exp``, which the
  interpreter computes with Inductor's own vectorized code (:mod:`._exp`, :func:`fuse_exp`), and which
  is kept as a call of that code if the fused graph differs;
* the ATen calls a loop makes once per tile (the same op on tiles of the same layout, none depending on
  another) run as one call on the tiles stacked (:func:`batch`): one call instead of one per tile, each
  element computed by the same kernel; if that graph's first run differs, the graph without it is
  compiled and checked instead;
* an output stored tile by tile is the concatenation of its tiles, or, when every tile is the same
  elementwise function of the same tiles of the inputs, that function of the whole inputs
  (:func:`_one_map`: one pass, no pieces to assemble);
* the first compiled run is checked against the traced (interpreted) run, bit for bit; a kernel whose
  replay differs, whose control flow reads its data (``bool()`` or ``.item()`` of a value computed from
  its inputs, as ``nl.device_print`` does) or whose graph does not compile keeps the interpreter.

``TORCHNEURON_NKI_REPLAY=0`` turns replay off (every call interpreted); :func:`replay_report` says what
each kernel and shape does.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import fx
from torch.utils import _pytree as pytree

from . import _dtypes

log = logging.getLogger("torchneuron")
aten = torch.ops.aten

#: Interpreted time at one kernel and key (seconds) after which its next call is traced and compiled:
#: compiling takes seconds (tens with a cold Inductor cache on a busy host), so a kernel called a few
#: times (a test) stays interpreted, one called in a loop is compiled once the loop has spent about
#: what compiling costs (the rent-or-buy rule fused eager uses).
COMPILE_AFTER_SECONDS = 10.0


def mode() -> str:
    """``TORCHNEURON_NKI_REPLAY``: "1" (the default: compiled once it pays, see COMPILE_AFTER_SECONDS),
    "early" (compiled at the second call of a key), "0" (never: every call interpreted)."""
    m = os.environ.get("TORCHNEURON_NKI_REPLAY", "1").strip().lower()
    if m in ("0", "false", "off", "no"):
        return "off"
    return "early" if m == "early" else "on"


def enabled() -> bool:
    return mode() != "off"


def usable() -> bool:
    """Replay is on, and nothing else is recording this thread's ops: no dispatch mode (a trace, a fake
    mode) and no fused eager group (which fuses the interpreter's ops itself)."""
    if not enabled():
        return False
    global _dispatch_mode, _eager_mode
    if _dispatch_mode is None:  # (imported at the first call: every call asks)
        from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode
        from torchneuron.neuron.eager import get_eager_mode as _eager_mode
    if _dispatch_mode() is not None:
        return False
    return _eager_mode() == "op"


_dispatch_mode: Optional[Callable] = None
_eager_mode: Optional[Callable] = None


def due(entry: "Entry") -> bool:
    """Whether the next call of ``entry`` is traced and compiled."""
    if entry.calls < 2:
        return False
    return mode() == "early" or entry.interpreted_seconds >= COMPILE_AFTER_SECONDS


@dataclasses.dataclass
class Entry:
    """One kernel at one key: how it runs."""

    calls: int = 0
    call: Any = None  # the KernelCall of the interpreted run (its instructions and peaks)
    runner: Optional[Callable] = None  # runs the compiled graph: runner(tensors) -> result
    interpret: bool = False  # keeps the interpreter (the reason says why)
    reason: str = ""
    compile_seconds: float = 0.0
    replays: int = 0
    interpreted_seconds: float = 0.0
    ops: Dict[str, int] = dataclasses.field(default_factory=dict)  # the compiled graph's ops, how many of each
    merges: int = 0  # groups of per-tile ATen calls run as one call each (batch())
    exp_fused: bool = False  # the interpreter's exp computed by Inductor's fused code (fuse_exp())
    aten_calls: int = 0  # ATen calls kept out of Inductor in the compiled graph (nki_exact ops, stores included)


_SIMPLE = (int, float, bool, str, type(None), torch.dtype, _dtypes.DType)


def _constant(v) -> Any:
    """A hashable stand-in for a non-tensor argument, or raise TypeError (such a call is not replayed)."""
    if isinstance(v, _SIMPLE):
        return (type(v).__name__, v)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_constant(x) for x in v))
    raise TypeError(type(v).__name__)


def key(grid, target: str, args, kwargs) -> Optional[tuple]:
    """What a call's bookkeeping depends on: its tensors' layouts, the other arguments, grid and target."""
    parts: List[Any] = [grid, target]
    storages: Dict[int, int] = {}  # which tensors share memory (aliasing changes what a kernel does)
    try:
        for name, v in itertools_chain(args, kwargs):
            if isinstance(v, torch.Tensor):
                if v.requires_grad or v.layout != torch.strided:
                    return None
                shared = storages.setdefault(v.untyped_storage()._cdata, len(storages))
                parts.append((name, "T", tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device, shared))
            else:
                parts.append((name, _constant(v)))
    except TypeError:
        return None
    return tuple(parts)


def itertools_chain(args, kwargs):
    for i, a in enumerate(args):
        yield i, a
    for k, v in kwargs.items():  # in the order given: the order of the kernel's tensors
        yield k, v


# ---- preparing the graph ------------------------------------------------------------------------------

# Ops whose Inductor code rounds as ATen's kernels do: elementwise IEEE arithmetic, comparisons,
# selections, casts and data movement, and rsqrt/sqrt (Inductor calls the same vectorized functions
# as ATen's CPU kernels; not ATen's exp, whose Inductor code differs in the last bit: the interpreter's
# exp is Inductor's, see fuse_exp). Everything else that computes runs as ATen's kernel (opaque to Inductor).
_FUSED = {
    "add", "sub", "mul", "neg", "abs", "maximum", "minimum", "where", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "clamp",
    "copy", "copy_", "clone", "_to_copy", "to", "empty", "empty_like", "empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "fill", "fill_", "arange", "scalar_tensor", "lift_fresh_copy",
    "view", "_unsafe_view", "reshape", "expand", "permute", "t", "transpose", "slice", "select", "unsqueeze",
    "squeeze", "as_strided", "alias", "index", "index_put", "index_put_", "cat", "stack", "unbind",
    "amax", "amin", "sqrt", "rsqrt", "reciprocal", "square", "relu", "sign", "floor", "ceil", "trunc",
    "mm", "bmm", "_local_scalar_dense",
}
# Division, also by a constant: neuron's Inductor keeps a division a division, as on the CPU (not a
# multiplication by the reciprocal: torchneuron.compile.inductor._get_constant_value).
_FUSED.add("div")

_LIB: Optional[torch.library.Library] = None
_OPAQUE: Dict[Any, Any] = {}


def _opaque(op):
    """``op`` as a custom op of the namespace ``nki_exact``: the same schema, running ATen's kernel; Inductor
    calls it as an external kernel."""
    global _LIB
    found = _OPAQUE.get(op)
    if found is not None:
        return found
    if _LIB is None:
        _LIB = torch.library.Library("nki_exact", "FRAGMENT")
    schema = op._schema
    name = f"{schema.name.split('::')[-1]}__{op._overloadname}".replace(".", "_")
    text = str(schema)
    _LIB.define(name + text[text.index("("):])

    def kernel(*args, **kwargs):
        return op(*args, **kwargs)

    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    found = _OPAQUE[op] = getattr(torch.ops.nki_exact, name).default
    return found


def _hbm_write():
    """``nki_exact::hbm_write_(dst, src)``: a store into HBM (a kernel's argument or output), ATen's copy_ in
    place. Inductor would make each store of a tile a select over the whole output, nested one store deep
    per tile; as an external call each store writes its region only."""
    global _LIB
    found = _OPAQUE.get("hbm_write_")
    if found is None:
        if _LIB is None:
            _LIB = torch.library.Library("nki_exact", "FRAGMENT")
        _LIB.define("hbm_write_(Tensor(a!) dst, Tensor src) -> ()")
        def hbm_write_(dst, src):
            dst.copy_(src)

        _LIB.impl("hbm_write_", hbm_write_, "CompositeExplicitAutograd")
        found = _OPAQUE["hbm_write_"] = torch.ops.nki_exact.hbm_write_.default
    return found


def _base_name(target) -> str:
    return target._schema.name.split("::")[-1] if isinstance(target, torch._ops.OpOverload) else ""


def _values(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> Dict[fx.Node, Any]:
    """Every node's value in a run of the graph on copies of ``inputs`` (the run's own state)."""
    values: Dict[fx.Node, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            values[n] = v
            return v

    Recorder(gm).run(*[t.clone() for t in inputs])
    return values


def _storages(v) -> List[int]:
    return [t.untyped_storage()._cdata for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor)]


def _mutated_args(n: fx.Node) -> List[Any]:
    if not isinstance(n.target, torch._ops.OpOverload):
        return []
    out = []
    for i, a in enumerate(n.target._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = n.args[i] if i < len(n.args) and not a.kwarg_only else n.kwargs.get(a.name)
            if v is not None:
                out.append(v)
    return out


def prepare(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> Tuple[fx.GraphModule, str]:
    """The traced graph made ready to compile (see the module's doc); ("", reason) when its control flow
    read its data."""
    values = _values(gm, inputs)
    graph = gm.graph
    nodes = list(graph.nodes)
    mutated = set()
    for n in nodes:
        for a in _mutated_args(n):
            for s in _storages(values.get(a) if isinstance(a, fx.Node) else None):
                mutated.add(s)
    # Dynamic: depends on the inputs (through values or through storages written with them).
    dynamic_storages = set()
    dynamic = set()
    for n in nodes:
        if n.op == "placeholder":
            dynamic.add(n)
            dynamic_storages.update(_storages(values[n]))
            continue
        if n.op != "call_function":
            continue
        ins = [a for a in n.all_input_nodes]
        dep = any(a in dynamic or any(s in dynamic_storages for s in _storages(values.get(a))) for a in ins)
        if dep:
            dynamic.add(n)
            if _base_name(n.target) in ("_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero"):
                return gm, f"its control flow reads its data ({n.target} of a value computed from its inputs)"
            for a in _mutated_args(n):
                dynamic_storages.update(_storages(values.get(a) if isinstance(a, fx.Node) else None))
            dynamic_storages.update(_storages(values.get(n)))
    # Constants: pure nodes whose inputs are constants and whose storage nothing writes.
    const = set()
    for n in nodes:
        if n.op != "call_function" or n in dynamic or _mutated_args(n):
            continue
        if any(a not in const for a in n.all_input_nodes):
            continue
        v = values.get(n)
        if not isinstance(v, torch.Tensor) or any(s in mutated for s in _storages(v)):
            continue
        const.add(n)
    count = 0
    for n in nodes:
        if n in const and any(u not in const for u in n.users):
            attr = f"_nki_const{count}"
            count += 1
            gm.register_buffer(attr, values[n].clone())
            with graph.inserting_before(n):
                g = graph.get_attr(attr)
            n.replace_all_uses_with(g)
            values[g] = getattr(gm, attr)
    graph.eliminate_dead_code()
    # Boolean-mask indices (constants) become the integer indices they select.
    for n in list(graph.nodes):
        name = _base_name(n.target) if n.op == "call_function" else ""
        if name in ("index", "index_put", "index_put_") and isinstance(n.args[1], (list, tuple)):
            new, changed = [], False
            for idx in n.args[1]:
                v = getattr(gm, idx.target) if isinstance(idx, fx.Node) and idx.op == "get_attr" else None
                if isinstance(v, torch.Tensor) and v.dtype == torch.bool:
                    for k, part in enumerate(v.nonzero().unbind(1)):
                        attr = f"_nki_const{count}"
                        count += 1
                        gm.register_buffer(attr, part.contiguous())
                        with graph.inserting_before(n):
                            new.append(graph.get_attr(attr))
                    changed = True
                else:
                    new.append(idx)
            if changed:
                n.args = (n.args[0], new) + tuple(n.args[2:])
    _loads_as_views(gm, values, mutated)
    # Stores into HBM: in place, one region each.
    hbm = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            hbm.update(_storages(values.get(n)))
        elif n.op == "output":
            for o in pytree.tree_leaves(n.args):
                if isinstance(o, fx.Node):
                    hbm.update(_storages(values.get(o)))
    _stores_as_cat(gm, values, hbm)
    _drop_unread_tiles(gm)
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is aten.copy_.default:
            dst = n.args[0]
            if any(st in hbm for st in _storages(values.get(dst))):
                with graph.inserting_before(n):
                    graph.call_function(_hbm_write(), (dst, n.args[1]))
                n.replace_all_uses_with(dst)
                graph.erase_node(n)
    # Ops Inductor would round differently run as ATen's kernels.
    for n in list(graph.nodes):
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        name = _base_name(n.target)
        if name in _FUSED or n.target.namespace == "nki_exact":
            continue
        if n.target is aten.pow.Tensor_Scalar and len(n.args) > 1 and n.args[1] == 2:
            continue  # x * x in both
        if _mutated_args(n):
            if name == "addmm_" or name.endswith("_"):
                functional = getattr(aten, name.rstrip("_"), None)
                overload = getattr(functional, n.target._overloadname, None) if functional is not None else None
                if overload is None:
                    return gm, f"{n.target} has no functional form to run as ATen's kernel"
                with graph.inserting_before(n):
                    r = graph.call_function(_opaque(overload), n.args, n.kwargs)
                    c = graph.call_function(aten.copy_.default, (n.args[0], r))
                n.replace_all_uses_with(c)
                graph.erase_node(n)
                continue
            return gm, f"{n.target} writes its arguments"
        target = n.target
        schema_args = target._schema.arguments
        if len(n.args) > 1 and isinstance(n.args[1], (int, float, bool)) and len(schema_args) > 1 \
                and isinstance(schema_args[1].type, torch.TensorType):
            # A Python number where the schema takes a tensor (a wrapped number): the Scalar overload.
            scalar = getattr(getattr(aten, name), "Scalar", None)
            if scalar is None:
                return gm, f"{n.target} with a number for a tensor"
            target = scalar
        n.target = _opaque(target)
    graph.lint()
    gm.recompile()
    return gm, ""


def _loads_as_views(gm: fx.GraphModule, values: Dict[fx.Node, Any], mutated: set) -> None:
    """A tile loaded whole from a kernel input that nothing writes (``nl.load``, ``dma_copy`` into a fresh
    tile) and never written again is read from the input itself: no copy for external kernels (matrix
    products) to wait on."""
    graph = gm.graph
    inputs = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            inputs.update(_storages(values.get(n)))
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in list(graph.nodes):
        if not (n.op == "call_function" and _base_name(n.target) in ("empty", "empty_strided")):
            continue
        copies = [u for u in n.users if u.op == "call_function" and u.target is aten.copy_.default and u.args[0] is n]
        if len(copies) != 1:
            continue
        c = copies[0]
        src = c.args[1]
        sv, tv = values.get(src), values.get(n)
        if not (isinstance(sv, torch.Tensor) and isinstance(tv, torch.Tensor)) or sv.shape != tv.shape \
                or sv.dtype != tv.dtype or not isinstance(src, fx.Node):
            continue
        if any(s not in inputs or s in mutated for s in _storages(sv)):
            continue
        if any(order[u] < order[c] for u in n.users if u is not c):
            continue  # read (or viewed) before it was loaded
        if any(_writes(u) for u in n.users if u is not c):
            continue
        n.replace_all_uses_with(src, delete_user_cb=lambda u: u is not c)
        c.replace_all_uses_with(src)
        graph.erase_node(c)
    graph.eliminate_dead_code()


def _writes(n: fx.Node) -> bool:
    """Whether ``n`` writes (it, or a view of it used later: any view counts)."""
    if _mutated_args(n):
        return True
    if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
        returns = n.target._schema.returns
        if returns and returns[0].alias_info is not None:  # a view: what it is used for counts
            return any(_writes(u) for u in n.users)
    return False


def _region(view: fx.Node, base: fx.Node, shape) -> Optional[Tuple[List[Tuple[int, int]], List[int]]]:
    """The box of ``base`` a chain of slice/select views selects: [(start, end)] per axis of ``base``, and the
    axes a select dropped; None for any other view."""
    chain = []
    n = view
    while n is not base:
        if not (n.op == "call_function" and n.target in (aten.slice.Tensor, aten.select.int)):
            return None
        chain.append(n)
        n = n.args[0]
    box = [[0, size] for size in shape]
    axes = list(range(len(shape)))  # the view's axes, as axes of base
    dropped = []
    for n in reversed(chain):
        if n.target is aten.select.int:
            d, i = n.args[1], n.args[2]
            b = axes.pop(d)
            lo, hi = box[b]
            i = i + (hi - lo) if i < 0 else i
            box[b] = [lo + i, lo + i + 1]
            dropped.append(b)
        else:
            d = n.args[1] if len(n.args) > 1 else 0
            start = n.args[2] if len(n.args) > 2 else None
            end = n.args[3] if len(n.args) > 3 else None
            step = n.args[4] if len(n.args) > 4 else 1
            if step != 1:
                return None
            b = axes[d]
            lo, hi = box[b]
            size = hi - lo
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else end)
            start, end = max(0, min(start, size)), max(0, min(end, size))
            box[b] = [lo + start, lo + max(start, end)]
    return [tuple(x) for x in box], sorted(dropped)


def _grid_cat(graph: fx.Graph, cells: Dict[tuple, fx.Node], shape, axis: int, fixed: tuple):
    """The cat over axis ``axis`` onward of the boxes in ``cells`` (a grid covering ``shape``), or None."""
    if axis == len(shape):
        return cells.get(fixed)
    cuts = sorted({box[axis] for box in cells if box[:axis] == fixed})
    if not cuts or cuts[0][0] != 0 or cuts[-1][1] != shape[axis]:
        return None
    for (a0, a1), (b0, b1) in zip(cuts, cuts[1:]):
        if a1 != b0:
            return None
    parts = []
    for cut in cuts:
        part = _grid_cat(graph, cells, shape, axis + 1, fixed + (cut,))
        if part is None:
            return None
        parts.append(part)
    if len(parts) == 1:
        return parts[0]
    return graph.call_function(aten.cat.default, (parts, axis))


def _stores_as_cat(gm: fx.GraphModule, values: Dict[fx.Node, Any], hbm: set) -> None:
    """An output the kernel made (``nl.ndarray(..., buffer=nl.shared_hbm)``) and wrote tile by tile, each
    element once, never read in the kernel: the cat of its tiles (Inductor writes each tile's computation
    into its place, and can fuse them)."""
    graph = gm.graph
    for base in list(graph.nodes):
        if not (base.op == "call_function" and _base_name(base.target) in ("empty", "empty_strided")):
            continue
        value = values.get(base)
        if not isinstance(value, torch.Tensor) or not any(s in hbm for s in _storages(value)):
            continue
        shape = tuple(value.shape)
        writes, ok = [], True
        # Every use of base: a chain of slice/select views ending in one copy_ into it, or the output.
        def visit(n):
            nonlocal ok
            for u in list(n.users):
                if u.op == "output":
                    continue
                if u.op == "call_function" and u.target is aten.copy_.default and u.args[0] is n and not u.users:
                    writes.append(u)
                elif u.op == "call_function" and u.target in (aten.slice.Tensor, aten.select.int) and u.args[0] is n:
                    visit(u)
                else:
                    ok = False
        visit(base)
        if not ok or not writes or not any(u.op == "output" for u in base.users):
            continue
        cells: Dict[tuple, fx.Node] = {}
        for w in writes:
            region = _region(w.args[0], base, shape)
            if region is None:
                ok = False
                break
            box, dropped = region
            if tuple(box) in cells:
                ok = False  # written twice
                break
            cells[tuple(box)] = (w, dropped)
        if not ok or sum(math_prod(b1 - b0 for b0, b1 in box) for box in cells) != math_prod(shape):
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        with graph.inserting_before(max(writes, key=order.get)):
            tiles = {}
            for box, (w, dropped) in cells.items():
                src = w.args[1]
                sv = values.get(src)
                if isinstance(sv, torch.Tensor) and sv.dtype != value.dtype:
                    src = graph.call_function(aten._to_copy.default, (src,), {"dtype": value.dtype})
                view_shape = [b1 - b0 for i, (b0, b1) in enumerate(box) if i not in dropped]
                src = graph.call_function(aten.expand.default, (src, view_shape))
                src = graph.call_function(aten.reshape.default, (src, [b1 - b0 for b0, b1 in box]))
                tiles[box] = src
            whole = _one_map(graph, cells, values, shape, value.dtype)
            if whole is None:
                whole = _grid_cat(graph, tiles, shape, 0, ())
            if whole is None:
                continue
        for w in writes:
            graph.erase_node(w)
        base.replace_all_uses_with(whole, delete_user_cb=lambda u: u.op == "output")
        values[whole] = value
    graph.eliminate_dead_code()


# Elementwise ops a tile's value may be computed with for a whole map of its tiles (_one_map).
_MAP_OPS = {
    "add", "sub", "mul", "div", "neg", "abs", "maximum", "minimum", "where", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "clamp", "sqrt",
    "rsqrt", "reciprocal", "relu", "sign", "floor", "ceil", "trunc", "_to_copy", "clone", "square", "pow",
    "vec_exp",
}


def _one_map(graph: fx.Graph, cells: Dict[tuple, Any], values: Dict[fx.Node, Any], shape, dtype):
    """An output written tile by tile where every tile is the same elementwise function of the same tiles of
    the kernel's inputs (a tensor add in [128, 512] tiles): that function of the whole inputs, computed in
    one pass into the output (the tiles' concatenation, nested per axis of the grid, copies each level).
    None when the tiles differ in anything else than where they are."""
    forms = []
    for box, (w, dropped) in cells.items():
        if dropped:
            return None
        form = _map_form(_copied_from(w.args[1], values), values, tuple(box), tuple(shape))
        if form is None:
            return None
        forms.append(form)
    if any(f != forms[0] for f in forms[1:]):
        return None
    made: Dict[Any, fx.Node] = {}

    def emit(form):
        if form[0] == "input":
            return form[1]
        if form[0] == "const":
            return form[1]
        found = made.get(form)
        if found is None:
            _, target, args, kwargs = form
            found = made[form] = graph.call_function(
                target, tuple(emit(a) if isinstance(a, tuple) and a and a[0] in ("input", "op") else _unform(a)
                              for a in args), dict((k, _unform(v)) for k, v in kwargs))
        return found

    whole = emit(forms[0])
    first = next(iter(cells.values()))[0].args[1]
    sv = values.get(_copied_from(first, values))
    if isinstance(sv, torch.Tensor) and sv.dtype != dtype:
        whole = graph.call_function(aten._to_copy.default, (whole,), {"dtype": dtype})
    return whole


def _unform(a):
    return a[1] if isinstance(a, tuple) and a and a[0] == "const" else a


def _map_form(n, values: Dict[fx.Node, Any], box: tuple, full: tuple):
    """``n``'s computation with each input tile named by the input (of the output's shape, ``full``) it is the
    ``box`` of, or None when it is not an elementwise computation of such tiles and constants."""
    n = _copied_from(n, values) if isinstance(n, fx.Node) else n
    if not isinstance(n, fx.Node):
        if isinstance(n, (int, float, bool, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return ("const", n)
        return None
    v = values.get(n)
    if not isinstance(v, torch.Tensor):
        return None
    size = tuple(b1 - b0 for b0, b1 in box)
    if n.op == "call_function" and n.target in (aten.slice.Tensor, aten.select.int):
        base = n
        while base.op == "call_function" and base.target in (aten.slice.Tensor, aten.select.int):
            base = base.args[0]
        bv = values.get(base)
        if base.op != "placeholder" or not isinstance(bv, torch.Tensor) or tuple(bv.shape) != full \
                or _written_through(base):  # (an input the kernel writes is read as it is at each load)
            return None
        region = _region(n, base, tuple(bv.shape))
        if region is None or region[1] or tuple(region[0]) != box or tuple(v.shape) != size:
            return None
        return ("input", base)
    if n.op != "call_function" or _base_name(n.target) not in _MAP_OPS or tuple(v.shape) != size:
        return None
    args = []
    for a in n.args:
        f = _map_form(a, values, box, full)
        if f is None:
            return None
        args.append(f)
    kwargs = []
    for k, a in n.kwargs.items():
        f = _map_form(a, values, box, full)
        if f is None or f[0] != "const":
            return None
        kwargs.append((k, f))
    return ("op", n.target, tuple(args), tuple(kwargs))


def math_prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


# ---- one ATen call for the same op on every tile ------------------------------------------------------

# Ops kept as ATen's kernels (opaque) that compute each element from the element at the same place: a batch
# of tiles stacked along a new first axis gives each tile's elements as its own call does.
_BATCH_ELEMENTWISE = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "sin", "cos", "tan", "asin",
    "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "gelu", "silu",
    "softplus", "mish", "elu", "logit", "pow", "div", "mul", "add", "sub", "round", "frac", "remainder",
    "fmod", "sqrt", "rsqrt", "reciprocal", "neg", "abs", "sign", "floor_divide", "hardsigmoid", "hardswish",
    "vec_exp",
}
# Ops kept as ATen's kernels that work along their ``dim`` argument: stacked, the same op along dim + 1.
_BATCH_ALONG_DIM = {
    "sum", "mean", "prod", "amax", "amin", "var", "std", "logsumexp", "norm", "cumsum", "cumprod", "softmax",
    "_softmax", "log_softmax", "_log_softmax", "argmax", "argmin", "nansum",
}


def _dependencies(gm: fx.GraphModule, values: Dict[fx.Node, Any]) -> Dict[fx.Node, set]:
    """Each node's predecessors: its inputs, and the nodes that must stay before it in memory order (the
    last writer of memory it reads or writes; the readers since then of memory it writes)."""
    preds: Dict[fx.Node, set] = {}
    last_writer: Dict[int, fx.Node] = {}
    readers: Dict[int, List[fx.Node]] = {}
    for n in gm.graph.nodes:
        p = set(n.all_input_nodes)
        written = set()
        for a in _mutated_args(n):
            if isinstance(a, fx.Node):
                written.update(_storages(values.get(a)))
        read = set()
        for a in n.all_input_nodes:
            read.update(_storages(values.get(a)))
        for s in read | written:
            w = last_writer.get(s)
            if w is not None:
                p.add(w)
        for s in written:
            p.update(readers.get(s, ()))
            last_writer[s], readers[s] = n, []
        for s in read - written:
            readers.setdefault(s, []).append(n)
        p.discard(n)
        preds[n] = p
    return preds


def _dim_arg(n: fx.Node) -> Tuple[Optional[int], Optional[str], Any]:
    """The position or keyword of ``n``'s ``dim`` argument and its value ((None, None, None) if none)."""
    for i, a in enumerate(n.target._schema.arguments):
        if a.name == "dim":
            if a.name in n.kwargs:
                return None, a.name, n.kwargs[a.name]
            if i < len(n.args) and not a.kwarg_only:
                return i, None, n.args[i]
            return None, None, a.default_value if a.has_default_value() else None
    return None, None, None


def _batch_key(n: fx.Node, values: Dict[fx.Node, Any]) -> Optional[tuple]:
    """What must be equal for ATen calls to run as one (op, the tile's layout, the other arguments), or None
    when ``n`` cannot be batched."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) \
            or n.target.namespace != "nki_exact" or not n.args or not isinstance(n.args[0], fx.Node):
        return None
    rest = list(n.args[1:]) + list(n.kwargs.values())
    if any(isinstance(a, fx.Node) for a in pytree.tree_leaves(rest)):
        return None
    name = n.target._schema.name.split("::")[-1].split("__")[0]
    v, out = values.get(n.args[0]), values.get(n)
    if not (isinstance(v, torch.Tensor) and isinstance(out, torch.Tensor)) or not v.is_contiguous():
        return None
    if name in _BATCH_ALONG_DIM:
        dim = _dim_arg(n)[2]
        if dim is None or (isinstance(dim, (list, tuple)) and not dim):  # over every element
            return None
    elif name not in _BATCH_ELEMENTWISE or out.shape != v.shape:
        return None
    return (n.target, tuple(v.shape), v.dtype, v.device, repr(rest))


def _shifted(dim):
    if isinstance(dim, (list, tuple)):
        return type(dim)(_shifted(d) for d in dim)
    return dim + 1 if dim >= 0 else dim


def _batch_once(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> bool:
    """Merge one group of independent ATen calls of the same op and layout (one per tile of a loop) into one
    call on their stacked tiles; the graph reordered to the merged call's place. False: nothing to merge."""
    values = _values(gm, inputs)
    graph = gm.graph
    nodes = list(graph.nodes)
    groups: Dict[tuple, List[fx.Node]] = {}
    for n in nodes:
        k = _batch_key(n, values)
        if k is not None:
            groups.setdefault(k, []).append(n)
    candidates = [g for g in groups.values() if len(g) > 1]
    if not candidates:
        return False
    preds = _dependencies(gm, values)
    succs: Dict[fx.Node, List[fx.Node]] = {n: [] for n in nodes}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)

    def descendants(n):
        seen, todo = set(), [n]
        while todo:
            for s in succs[todo.pop()]:
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        return seen

    members: List[fx.Node] = []
    for group in candidates:
        below = {n: descendants(n) for n in group}
        chosen = []
        for n in group:  # members none of which depends on another
            if all(n not in below[c] and c not in below[n] for c in chosen):
                chosen.append(n)
        if len(chosen) > 1:
            members = chosen
            break
    if not members:
        return False
    order = {n: i for i, n in enumerate(nodes)}
    k = len(members)
    first = members[0]
    ins = [m.args[0] for m in members]
    # Tiles that are the parts of an earlier merged call, in order (copied whole into tiles of their own or
    # not): that call's result is their stack already.
    sources = [_copied_from(i, values) for i in ins]
    base = sources[0].args[0] if sources[0].op == "call_function" and sources[0].target is aten.select.int else None
    bv = values.get(base) if base is not None else None
    whole = (isinstance(bv, torch.Tensor) and bv.is_contiguous() and bv.shape[0] == k and all(
        i.op == "call_function" and i.target is aten.select.int and i.args[0] is base and i.args[1] == 0
        and i.args[2] == j for j, i in enumerate(sources)) and not _written_through(base))
    block = None if whole else _row_block(sources, values)
    new: List[fx.Node] = []
    with graph.inserting_before(first):
        if whole:
            stacked = base
        elif block is not None:  # consecutive row tiles of one input: a view of its rows, no copy
            source, start, rows = block
            part = graph.call_function(aten.slice.Tensor, (source, 0, start, start + k * rows))
            stacked = graph.call_function(aten.view.default, (part, [k, rows] + list(values[source].shape[1:])))
            new += [part, stacked]
        else:
            stacked = graph.call_function(aten.stack.default, (ins, 0))
            new.append(stacked)
        args, kwargs = list(first.args), dict(first.kwargs)
        args[0] = stacked
        if _dim_arg(first)[2] is not None and _base_name_of(first) in _BATCH_ALONG_DIM:
            pos, kw, dim = _dim_arg(first)
            if pos is not None:
                args[pos] = _shifted(dim)
            else:
                kwargs[kw or "dim"] = _shifted(dim)
        merged = graph.call_function(first.target, tuple(args), kwargs)
        parts = [graph.call_function(aten.select.int, (merged, 0, j)) for j in range(k)]
    new += [merged] + parts
    # The order: every node after what it depends on; the merged call as early as it can run.
    index = dict(order)
    for j, x in enumerate(new):
        index[x] = order[first] - 1 + (j + 1) / (len(new) + 1)
    deps: Dict[fx.Node, set] = {}
    gone = set(members)
    for n in nodes:
        if n in gone:
            continue
        p = preds[n]
        deps[n] = (p - gone) | ({merged} if p & gone else set())
    before = set().union(*(preds[m] for m in members)) - gone
    for x in new:
        if x is merged:
            break
        deps[x] = set(before)
    deps[merged] = {stacked} | before
    for m, part in zip(members, parts):
        deps[part] = {merged}
        m.replace_all_uses_with(part)
    for n in list(deps):
        deps[n] |= set(n.all_input_nodes)
        deps[n].discard(n)
    for m in members:
        graph.erase_node(m)
    _reorder(graph, deps, index)
    graph.lint()
    return True


def _row_block(sources: List[fx.Node], values: Dict[fx.Node, Any]) -> Optional[Tuple[fx.Node, int, int]]:
    """For tiles that are consecutive blocks of rows, whole rows, of one contiguous input nothing writes (the
    loads of a loop over row tiles, read in place): (the input, its first row, rows per tile); else None."""
    found = []
    for src in sources:
        base = src
        while base.op == "call_function" and base.target in (aten.slice.Tensor, aten.select.int):
            base = base.args[0]
        bv = values.get(base)
        if base is src or base.op != "placeholder" or not isinstance(bv, torch.Tensor) or not bv.is_contiguous():
            return None
        region = _region(src, base, tuple(bv.shape))
        if region is None or region[1] or any(box != (0, size) for box, size in zip(region[0][1:], bv.shape[1:])):
            return None
        found.append((base, region[0][0]))
    base, (start, end) = found[0]
    rows = end - start
    if rows <= 0 or _written_through(base):
        return None
    for j, (b, (lo, hi)) in enumerate(found):
        if b is not base or lo != start + j * rows or hi != lo + rows:
            return None
    return base, start, rows


def _drop_unread_tiles(gm: fx.GraphModule) -> None:
    """Writes into tiles nothing reads (left behind when the stores of an output no longer read them) go."""
    graph = gm.graph
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and n.target is aten.copy_.default and not n.users:
            tile = n.args[0]
            if isinstance(tile, fx.Node) and tile.op == "call_function" and \
                    _base_name(tile.target) in ("empty", "empty_strided") and set(tile.users) == {n}:
                graph.erase_node(n)
    graph.eliminate_dead_code()


def _written_through(n: fx.Node, skip: Optional[fx.Node] = None) -> bool:
    """Whether a node (other than ``skip``) writes into ``n``'s value (into it, or into a view of it)."""
    for u in n.users:
        if u is skip:
            continue
        if any(a is n for a in _mutated_args(u)):
            return True
        if u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload) and u.args and u.args[0] is n:
            returns = u.target._schema.returns
            if returns and returns[0].alias_info is not None and _written_through(u):
                return True
    return False


def _copied_from(n: fx.Node, values: Dict[fx.Node, Any]) -> fx.Node:
    """What tile ``n`` holds: for a tile (or the copy_ that wrote it) written once, whole, by a copy of another
    value of its shape and dtype and never written otherwise, that value (looked through again); else ``n``."""
    while n.op == "call_function":
        tile = n.args[0] if n.target is aten.copy_.default else n
        if not (isinstance(tile, fx.Node) and tile.op == "call_function"
                and _base_name(tile.target) in ("empty", "empty_strided")):
            break
        copies = [u for u in tile.users if u.op == "call_function" and u.target is aten.copy_.default
                  and u.args[0] is tile]
        if len(copies) != 1 or (n is not tile and copies[0] is not n):
            break
        if _written_through(tile, skip=copies[0]) or _written_through(copies[0]):
            break
        src = copies[0].args[1]
        sv, tv = values.get(src), values.get(tile)
        if not (isinstance(src, fx.Node) and isinstance(sv, torch.Tensor) and isinstance(tv, torch.Tensor)) \
                or sv.shape != tv.shape or sv.dtype != tv.dtype:
            break
        n = src
    return n


def _base_name_of(n: fx.Node) -> str:
    return n.target._schema.name.split("::")[-1].split("__")[0]


def _reorder(graph: fx.Graph, deps: Dict[fx.Node, set], index: Dict[fx.Node, float]) -> None:
    """Put the graph's nodes in an order where each follows its ``deps``, the earliest-placed ready node first."""
    import heapq

    output = graph.output_node()
    waiting = {n: len(d) for n, d in deps.items() if n is not output}
    users: Dict[fx.Node, List[fx.Node]] = {}
    for n, d in deps.items():
        if n is output:
            continue
        for p in d:
            users.setdefault(p, []).append(n)
    ready = [(index[n], id(n), n) for n, c in waiting.items() if c == 0]
    heapq.heapify(ready)
    out: List[fx.Node] = []
    while ready:
        _, _, n = heapq.heappop(ready)
        out.append(n)
        for u in users.get(n, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (index[u], id(u), u))
    if len(out) != len(waiting):
        raise RuntimeError("nki replay: batching made a cycle")
    for n in out:
        output.prepend(n)


def _batched(gm: fx.GraphModule, inputs: Sequence[torch.Tensor], name: str) -> int:
    """batch(gm), or 0 when the graph cannot be reordered (``gm`` is then not to be used)."""
    try:
        return batch(gm, inputs)
    except Exception as e:  # noqa: BLE001  (a graph batch() cannot reorder: compiled as prepared)
        log.info("nki %s: the per-tile ATen calls stay apart (%s: %s)", name, type(e).__name__, e)
        return 0


def fuse_exp(gm: fx.GraphModule) -> int:
    """The interpreter's ``exp`` (``nki_exact::vec_exp``, Inductor's vectorized code, :mod:`._exp`) as
    ``aten.exp``, which Inductor fuses with the ops around it and computes with the same vector function.
    Returns how many; the first compiled run checks that each element came out the same."""
    from ._exp import vec_exp

    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is vec_exp:
            n.target = aten.exp.default
            count += 1
    if count:
        gm.recompile()
    return count


def batch(gm: fx.GraphModule, inputs: Sequence[torch.Tensor], limit: int = 64) -> int:
    """Merge the prepared graph's per-tile ATen calls (the same op on tiles of the same layout, independent of
    each other, as the iterations of an ``nl.affine_range`` loop are) into one call each, on the tiles stacked:
    one call instead of one per tile. Returns the number of merges. Whether each merged call gives every
    element as the calls it replaces did is checked with the rest of the graph, by the first compiled run."""
    merges = 0
    while merges < limit and _batch_once(gm, inputs):
        merges += 1
    if merges:
        graph = gm.graph
        graph.eliminate_dead_code()
        graph.lint()
        gm.recompile()
    return merges


# ---- tracing and compiling ------------------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.is_floating_point() or t.is_complex():
        return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


class _NoGrad:
    def __enter__(self):
        self.grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.grad)


def trace_and_compile(entry: Entry, name: str, interpret: Callable, tensors: List[torch.Tensor]):
    """Run the kernel once through the interpreter under make_fx (``interpret(tensors) -> (result, call)``,
    result with tensors unwrapped); compile its graph. Returns this call's (result, call); on success
    ``entry.runner`` is set, else ``entry.interpret`` with the reason."""
    from torch.fx.experimental.proxy_tensor import make_fx

    before = [t.clone() for t in tensors]
    box: Dict[str, Any] = {}

    def traced(*ts):
        result, call = interpret(list(ts))
        leaves, spec = pytree.tree_flatten(result)
        box["spec"], box["call"] = spec, call
        where, outs = [], []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                same = [i for i, t in enumerate(ts) if t is leaf]
                if same:
                    where.append(("input", same[0]))
                else:
                    where.append(("output", len(outs)))
                    outs.append(leaf)
            else:
                where.append(("value", leaf))
        box["where"], box["outputs"] = where, outs
        return tuple(outs)

    with _NoGrad():
        gm = make_fx(traced, tracing_mode="real", _error_on_data_dependent_ops=False)(*tensors)
    # The traced run is an interpreted run: its outputs are the interpreter's.
    call, spec, where, interpreted = box["call"], box["spec"], box["where"], box["outputs"]
    after = list(tensors)

    def rebuild(outs, ins):
        leaves = [ins[i] if kind == "input" else (outs[i] if kind == "output" else i) for kind, i in where]
        return pytree.tree_unflatten(leaves, spec)

    if getattr(call, "not_replayable", ""):  # the interpreter does something a graph would not repeat
        entry.interpret, entry.reason = True, call.not_replayable
        log.info("nki %s: replay keeps the interpreter: %s", name, entry.reason)
        return rebuild(interpreted, tensors), call
    try:
        start = time.perf_counter()
        prepared, reason = prepare(gm, before)  # (the graph as traced: its reads of values included)
        if reason:
            entry.interpret, entry.reason = True, reason
            log.info("nki %s: replay keeps the interpreter: %s", name, reason)
            return rebuild(interpreted, tensors), call
        # First the interpreter's exp fused by Inductor (fuse_exp()) with the per-tile ATen calls merged
        # (batch()); if that graph differs or fails, exp as the interpreter's kernel, merged; then unmerged.
        attempts = []
        fused = copy.deepcopy(prepared)
        if fuse_exp(fused):
            merged = copy.deepcopy(fused)
            fused_merges = _batched(merged, before, name)
            attempts.append((merged, fused_merges, True) if fused_merges else (fused, 0, True))
        batched = copy.deepcopy(prepared)
        merges = _batched(batched, before, name)
        if merges:
            attempts.append((batched, merges, False))
        attempts.append((prepared, 0, False))
        failure = ""
        for graph_module, merges, exp_fused in attempts:
            try:
                compiled = _compile(graph_module, tensors)
            except Exception as e:  # noqa: BLE001  (any compile failure: the next attempt, or the interpreter)
                failure = f"its graph did not compile ({type(e).__name__}: {e})"
                continue
            # The check: the compiled graph, on the inputs as they were, against the interpreted run.
            ins = [t.clone() for t in before]
            with _NoGrad():
                outs = compiled(*ins)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            bad = [i for i, (a, b) in enumerate(zip(outs, interpreted)) if not same_bits(a, b)]
            bad += [f"argument {i}" for i, (a, b) in enumerate(zip(ins, after)) if not same_bits(a, b)]
            if bad or len(outs) != len(interpreted):
                failure = f"its compiled graph differs from the interpreter (outputs {bad})"
                if merges or exp_fused:
                    log.info("nki %s: with %s %s; compiled again without", name,
                             "its exp fused" if exp_fused else "its per-tile ATen calls merged", failure)
                continue
            entry.merges, entry.exp_fused, failure = merges, exp_fused, ""
            entry.ops = {}
            for n in graph_module.graph.nodes:
                if n.op == "call_function":
                    entry.ops[str(n.target)] = entry.ops.get(str(n.target), 0) + 1
            entry.aten_calls = sum(1 for n in graph_module.graph.nodes if n.op == "call_function"
                                   and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "nki_exact")
            break
        entry.compile_seconds = time.perf_counter() - start
        if failure:
            entry.interpret, entry.reason = True, failure
            log.info("nki %s: replay keeps the interpreter: %s", name, entry.reason)
            return rebuild(interpreted, tensors), call
    except Exception as e:  # noqa: BLE001  (any compile failure: the interpreter stays)
        entry.interpret, entry.reason = True, f"its graph did not compile ({type(e).__name__}: {e})"
        log.info("nki %s: replay keeps the interpreter: %s", name, entry.reason)
        return rebuild(interpreted, tensors), call

    def runner(ts: List[torch.Tensor]):
        with _NoGrad():
            outs = compiled(*ts)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        return rebuild(outs, ts)

    entry.runner = runner
    return rebuild(interpreted, tensors), call


def _compile(gm: fx.GraphModule, tensors: List[torch.Tensor]) -> Callable:
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from torchneuron.compile.dynamo_backend import neuron

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    examples = [fake_mode.from_tensor(t, static_shapes=True) for t in tensors]
    with _NoGrad(), tracing(TracingContext(fake_mode)):
        return neuron(gm, examples)


@dataclasses.dataclass
class ReplayReport:
    """What each kernel and key does: replayed (compiled), or interpreted, and why."""

    rows: List[Tuple[str, Entry]]

    def __str__(self) -> str:
        lines = [f"nki replay: {len(self.rows)} kernel shapes"]
        for name, e in self.rows:
            how = (f"replayed {e.replays} times (compiled in {e.compile_seconds:.1f} s, {e.aten_calls} ATen calls "
                   f"kept{', exp fused' if e.exp_fused else ''})" if e.runner is not None
                   else ("interpreted: " + e.reason if e.interpret else f"interpreted ({e.calls} calls so far)"))
            lines.append(f"  {name}: {how}")
        return "\n".join(lines)


# Per kernel function (a grid launch makes a Kernel object per call): key -> Entry.
_CACHE: "weakref.WeakKeyDictionary[Callable, Dict[tuple, Entry]]" = weakref.WeakKeyDictionary()


def entries(fn: Callable) -> Dict[tuple, Entry]:
    found = _CACHE.get(fn)
    if found is None:
        found = _CACHE[fn] = {}
    return found


def replay_report() -> ReplayReport:
    """Each kernel function and key seen: replayed (compiled), or interpreted and why."""
    return ReplayReport([(fn.__name__, e) for fn, table in list(_CACHE.items()) for e in table.values()])
