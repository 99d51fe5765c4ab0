"""Property-based tests of views, copies and memory on neuron (hypothesis).

Each test draws a random sequence of tensor manipulations (shapes, strides,
storage offsets, transposes, slices, as_strided, expand, resize_, in-place
writes through views, copies between the CPU, neuron:0 and neuron:1,
contiguous or not), runs it on neuron and on the CPU, and requires the same
metadata (sizes, strides, storage offsets), the same values in every view and
in the base storage, and the same errors.

Examples are derandomized so the default suite is reproducible; raise
``TORCHNEURON_HYPOTHESIS_EXAMPLES`` (default 40) and unset derandomization with
``TORCHNEURON_HYPOTHESIS_RANDOM=1`` to search harder.
"""

import gc
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

# copies between dtypes may drop imaginary parts on purpose (on both devices alike)
pytestmark = pytest.mark.filterwarnings("ignore:Casting complex values to real discards")

EXAMPLES = int(os.environ.get("TORCHNEURON_HYPOTHESIS_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("TORCHNEURON_HYPOTHESIS_RANDOM", "") in ("", "0"),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
          torch.uint8, torch.bool, torch.complex64]


def _devices():
    n = torch.neuron.device_count()
    return ["neuron:0", "neuron:1"] if n > 1 else ["neuron:0"]


def _values(numel, dtype, salt=0):
    """Deterministic, distinct-ish values of a dtype (so misplaced elements show)."""
    x = torch.arange(numel, dtype=torch.float64) * 0.5 + salt - numel / 3
    if dtype == torch.bool:
        return (torch.arange(numel) + salt) % 3 == 0
    if dtype.is_complex:
        return torch.complex(x, -x * 0.25 + 1).to(dtype)
    if dtype == torch.uint8:
        return ((torch.arange(numel) + salt) % 251).to(dtype)
    return x.to(dtype)


def _shaped(shape, dtype, salt=0):
    """_values laid out in `shape`, on the CPU."""
    return _values(math.prod(shape), dtype, salt).reshape(shape)


def _same_meta(d, c, what):
    assert d.device.type == "neuron", f"{what}: on {d.device}"
    assert d.dtype == c.dtype, f"{what}: dtype {d.dtype} vs {c.dtype}"
    assert d.shape == c.shape, f"{what}: shape {tuple(d.shape)} vs {tuple(c.shape)}"
    if d.numel() > 1:
        assert d.stride() == c.stride(), f"{what}: strides {d.stride()} vs {c.stride()}"
    assert d.storage_offset() == c.storage_offset(), f"{what}: offset {d.storage_offset()} vs {c.storage_offset()}"
    assert d.is_conj() == c.is_conj() and d.is_neg() == c.is_neg(), f"{what}: conj/neg bits"


def _same(d, c, what):
    _same_meta(d, c, what)
    torch.testing.assert_close(d.cpu(), c, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _storage_as_tensor(t):
    """The whole storage of ``t`` as a flat tensor of its dtype (views of it included)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))


def _same_storage(d, c, what):
    torch.testing.assert_close(_storage_as_tensor(d).cpu(), _storage_as_tensor(c), rtol=0, atol=0,
                               equal_nan=True, msg=lambda m: f"{what} (whole storage): {m}")


def _both(fn, d, c):
    """Apply fn to the neuron and the CPU tensor; both must succeed or both raise."""
    try:
        rc = fn(c)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            fn(d)
        return None, None
    return fn(d), rc


# ---- random views --------------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4)


@st.composite
def view_step(draw, t):
    """One view or in-place write applicable to the (CPU) tensor t, as (name, fn)."""
    nd = t.dim()
    kinds = ["as_strided", "fill", "add", "copy", "setitem", "clone_contiguous", "as_strided_", "set_",
             "unsqueeze_", "move"]
    if nd >= 1:
        kinds += ["slice", "select", "narrow", "flip_dims", "unsqueeze", "unfold", "chunk"]
    if nd >= 2:
        kinds += ["transpose", "permute", "diagonal", "t"]
    if any(s == 1 for s in t.shape) or nd < 4:
        kinds += ["expand"]
    if t.is_contiguous():
        kinds += ["view"]
    if t.is_complex():
        kinds += ["conj", "view_as_real"]
    if t.dtype.is_floating_point or t.is_complex():
        kinds += ["neg_view"]
    kind = draw(st.sampled_from(kinds))

    if kind == "slice":
        dim = draw(st.integers(0, nd - 1))
        n = t.shape[dim]
        start = draw(st.integers(0, n))
        stop = draw(st.integers(start, n))
        step = draw(st.integers(1, 3))
        idx = (slice(None),) * dim + (slice(start, stop, step),)
        return f"[{idx}]", lambda x: x[idx]
    if kind == "select":
        dim = draw(st.integers(0, nd - 1))
        assume(t.shape[dim] > 0)
        i = draw(st.integers(-t.shape[dim], t.shape[dim] - 1))
        return f"select({dim},{i})", lambda x: x.select(dim, i)
    if kind == "narrow":
        dim = draw(st.integers(0, nd - 1))
        start = draw(st.integers(0, t.shape[dim]))
        length = draw(st.integers(0, t.shape[dim] - start))
        return f"narrow({dim},{start},{length})", lambda x: x.narrow(dim, start, length)
    if kind == "transpose":
        a, b = draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1))
        return f"transpose({a},{b})", lambda x: x.transpose(a, b)
    if kind == "t":
        return "mT", lambda x: x.mT
    if kind == "permute":
        perm = draw(st.permutations(range(nd)))
        return f"permute({perm})", lambda x: x.permute(*perm)
    if kind == "diagonal":
        a, b = draw(st.sampled_from([(i, j) for i in range(nd) for j in range(nd) if i != j]))
        off = draw(st.integers(-2, 2))
        return f"diagonal({off},{a},{b})", lambda x: x.diagonal(off, a, b)
    if kind == "unsqueeze":
        dim = draw(st.integers(0, nd))
        return f"unsqueeze({dim})", lambda x: x.unsqueeze(dim)
    if kind == "flip_dims":  # movedim: a view
        a, b = draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1))
        return f"movedim({a},{b})", lambda x: x.movedim(a, b)
    if kind == "unfold":
        dim = draw(st.integers(0, nd - 1))
        size = draw(st.integers(0, max(0, t.shape[dim])))
        step = draw(st.integers(1, 3))
        return f"unfold({dim},{size},{step})", lambda x: x.unfold(dim, size, step)
    if kind == "chunk":
        dim = draw(st.integers(0, nd - 1))
        chunks = draw(st.integers(1, 3))
        which = draw(st.integers(0, 2))
        return f"chunk({chunks},{dim})[{which}]", lambda x: x.chunk(chunks, dim)[min(which, len(x.chunk(chunks, dim)) - 1)] if x.shape[dim] else x
    if kind == "expand":
        lead = draw(st.integers(0, 1))
        sizes = [draw(st.integers(0, 3))] * lead + [
            draw(st.integers(0, 3)) if s == 1 else s for s in t.shape]
        return f"expand({sizes})", lambda x: x.expand(*sizes)
    if kind == "view":
        shape = draw(st.sampled_from([(-1,), (t.numel(),)] + ([(1, -1), (-1, 1)] if t.numel() else [])))
        return f"view({shape})", lambda x: x.view(*shape)
    if kind == "as_strided":
        storage_numel = t.untyped_storage().nbytes() // t.element_size()
        nd2 = draw(st.integers(0, 3))
        size = [draw(st.integers(0, 4)) for _ in range(nd2)]
        stride = [draw(st.integers(0, 4)) for _ in range(nd2)]
        span = sum((s - 1) * st_ for s, st_ in zip(size, stride)) if all(size) else -1
        assume(span + 1 <= storage_numel or not all(size))
        offset = draw(st.integers(0, max(0, storage_numel - span - 1)))
        return (f"as_strided({size},{stride},{offset})",
                lambda x: x.as_strided(size, stride, offset))
    if kind == "as_strided_":  # in place: changes the tensor's own metadata
        storage_numel = t.untyped_storage().nbytes() // t.element_size()
        size = [draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 3)))]
        stride = [draw(st.integers(0, 3)) for _ in size]
        span = sum((s - 1) * st_ for s, st_ in zip(size, stride)) if all(size) else -1
        assume(span + 1 <= storage_numel or not all(size))
        offset = draw(st.integers(0, max(0, storage_numel - span - 1)))
        return f"as_strided_({size},{stride},{offset})", lambda x: x.as_strided_(size, stride, offset)
    if kind == "set_":  # re-seat on the same storage with new geometry
        storage_numel = t.untyped_storage().nbytes() // t.element_size()
        n = draw(st.integers(0, storage_numel))
        offset = draw(st.integers(0, storage_numel - n))
        return f"set_(storage, {offset}, ({n},))", lambda x: x.set_(x.untyped_storage(), offset, (n,), (1,))
    if kind == "unsqueeze_":
        dim = draw(st.integers(0, nd))
        second = draw(st.sampled_from(["t_", "squeeze_", "transpose_", "none"]))

        def meta_inplace(x):
            x.unsqueeze_(dim)
            if second == "t_" and x.dim() <= 2:
                x.t_()
            elif second == "squeeze_":
                x.squeeze_()
            elif second == "transpose_" and x.dim() >= 2:
                x.transpose_(0, x.dim() - 1)
            return x
        return f"unsqueeze_({dim}).{second}", meta_inplace
    if kind == "move":  # round trip through another device (a copy on neuron, a clone on the CPU)
        via = draw(st.sampled_from(["cpu"] + _devices()))
        back_noncontig = draw(st.booleans())

        def move(x):
            if x.device.type == "cpu":
                y = x.clone()
            else:
                y = x.to(via, copy=True).to(x.device)
            return y.mT if back_noncontig and y.dim() >= 2 else y
        return f"move(via {via}, mT={back_noncontig})", move
    if kind == "conj":
        return "conj", lambda x: x.conj()
    if kind == "neg_view":
        return "_neg_view", lambda x: x._neg_view()
    if kind == "view_as_real":
        return "view_as_real", lambda x: torch.view_as_real(x.resolve_conj()) if x.is_conj() else torch.view_as_real(x)
    if kind == "clone_contiguous":
        fmt = draw(st.sampled_from(["clone", "contiguous"]))
        return fmt, (lambda x: x.clone()) if fmt == "clone" else (lambda x: x.contiguous())
    # in-place writes through the view (return the same view)
    if kind == "fill":
        v = draw(st.integers(-3, 3))
        return f"fill_({v})", lambda x: x.fill_(bool(v) if x.dtype == torch.bool else v)
    if kind == "add":
        return "add_(1) / logical_not_", lambda x: x.logical_not_() if x.dtype == torch.bool else x.add_(1)
    if kind == "copy":
        src_shape = draw(st.sampled_from([tuple(t.shape), tuple(t.shape[1:]) if nd else (), (1,) * nd]))
        src_dtype = draw(st.sampled_from(DTYPES))
        src_dev = draw(st.sampled_from(["same", "cpu"] + _devices()))
        transposed = draw(st.booleans())
        salt = draw(st.integers(0, 9))

        def copy(x):
            src = _shaped(src_shape, src_dtype, salt)
            if transposed and src.dim() >= 2:
                src = src.mT.contiguous().mT
            dev = x.device if src_dev == "same" else src_dev
            if x.device.type == "cpu":  # the CPU run: everything stays on the CPU
                dev = "cpu"
            return x.copy_(src.to(dev))
        return f"copy_({src_shape},{src_dtype},{src_dev},transposed={transposed})", copy
    assert kind == "setitem"
    nd_idx = draw(st.integers(0, nd)) if nd else 0
    idx = []
    for d in range(nd_idx):
        n = t.shape[d]
        start = draw(st.integers(0, n))
        idx.append(slice(start, draw(st.integers(start, n)), draw(st.integers(1, 2))))
    idx = tuple(idx)
    v = draw(st.integers(-2, 2))

    def setitem(x):
        x[idx] = bool(v) if x.dtype == torch.bool else v
        return x
    return f"[{idx}] = {v}", setitem


@SETTINGS
@given(data=st.data(), shape=shapes, dtype=st.sampled_from(DTYPES), device=st.sampled_from(_devices()),
       steps=st.integers(1, 6))
def test_view_chains_match_cpu(data, shape, dtype, device, steps):
    base_c = _shaped(shape, dtype)
    base_d = base_c.to(device)
    c, d = base_c, base_d
    history = []
    for _ in range(steps):
        name, fn = data.draw(view_step(c), label="step")
        history.append(name)
        what = " -> ".join(history)
        try:
            new_c = fn(c)
        except Exception as e:  # noqa: BLE001
            with pytest.raises(type(e)):
                fn(d)
            continue
        new_d = fn(d)
        assert new_d.device == torch.device(device), f"{what}: result on {new_d.device}"
        c, d = new_c, new_d
        _same(d, c, what)
        shares_c = c.untyped_storage()._cdata == base_c.untyped_storage()._cdata
        shares_d = d.untyped_storage()._cdata == base_d.untyped_storage()._cdata
        assert shares_d == shares_c, f"{what}: shares its base's storage on the CPU: {shares_c}, on neuron: {shares_d}"
        if shares_c:
            _same(base_d, base_c, f"base after {what}")
        _same_storage(d, c, what)


@SETTINGS
@given(shape=shapes, new_shape=shapes, dtype=st.sampled_from(DTYPES), device=st.sampled_from(_devices()),
       channels_last=st.booleans(), through_view=st.booleans())
def test_resize_matches_cpu(shape, new_shape, dtype, device, channels_last, through_view):
    c = _shaped(shape, dtype)
    d = c.to(device)
    if through_view and c.dim() >= 1:
        c, d = c[:], d[:]  # resize_ of a view (shares the base storage)
    fmt = torch.channels_last if channels_last and len(new_shape) == 4 else torch.contiguous_format
    c.resize_(new_shape, memory_format=fmt)
    d.resize_(new_shape, memory_format=fmt)
    _same_meta(d, c, f"resize_({new_shape})")
    assert d.untyped_storage().nbytes() >= d.numel() * d.element_size()
    # elements that existed before keep their values; fresh ones are uninitialized on both
    keep = min(math.prod(shape), d.numel())
    torch.testing.assert_close(_storage_as_tensor(d)[:keep].cpu(), _storage_as_tensor(c)[:keep], rtol=0, atol=0,
                               equal_nan=True)
    d.fill_(1), c.fill_(1)
    _same(d, c, "fill after resize_")
    d.resize_(0), c.resize_(0)
    _same_meta(d, c, "resize_(0)")


# ---- copies between CPU, neuron:0 and neuron:1 ---------------------------------------------------

@st.composite
def placed(draw, devices, allow_overlap):
    """(shape, layout recipe, device): a tensor recipe to build on a device."""
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    layouts = ["contiguous", "transposed", "strided_slice", "offset"]
    if allow_overlap:
        layouts.append("expanded")
    return shape, draw(st.sampled_from(layouts)), draw(st.sampled_from(devices))


def _build(shape, layout, device, dtype, salt):
    """A tensor of `shape` with the given layout on `device` (values are made on the CPU)."""
    n = math.prod(shape)
    if layout == "transposed" and len(shape) >= 2:
        return _shaped(shape, dtype, salt).mT.contiguous().to(device).mT
    if layout == "strided_slice" and len(shape) >= 1:
        big = list(shape)
        big[-1] = shape[-1] * 2
        return _shaped(big, dtype, salt).to(device)[..., ::2]
    if layout == "offset":
        return _values(n + 3, dtype, salt).to(device)[3:].view(shape)
    if layout == "expanded" and len(shape) >= 1 and shape[0] > 0:
        return _values(n // shape[0] if shape[0] else 0, dtype, salt).reshape((1,) + shape[1:]).to(device).expand(shape)
    return _shaped(shape, dtype, salt).to(device)


@SETTINGS
@given(src=placed(["cpu"] + _devices(), allow_overlap=True), dst_layout=st.sampled_from(
       ["contiguous", "transposed", "strided_slice", "offset"]), dst_device=st.sampled_from(["cpu"] + _devices()),
       src_dtype=st.sampled_from(DTYPES), dst_dtype=st.sampled_from(DTYPES), non_blocking=st.booleans(),
       broadcast=st.booleans())
def test_copy_between_devices_matches_cpu(src, dst_layout, dst_device, src_dtype, dst_dtype, non_blocking, broadcast):
    shape, src_layout, src_device = src
    src_shape = shape[1:] if broadcast and shape else shape
    s_d = _build(src_shape, src_layout, src_device, src_dtype, 1)
    s_c = _build(src_shape, src_layout, "cpu", src_dtype, 1)
    t_d = _build(shape, dst_layout, dst_device, dst_dtype, 2)
    t_c = _build(shape, dst_layout, "cpu", dst_dtype, 2)
    r_d, r_c = _both(lambda t: t.copy_(s_d if t is t_d else s_c, non_blocking=non_blocking), t_d, t_c)
    if r_c is None:
        return
    assert r_d is t_d
    assert t_d.device == torch.device(dst_device)
    torch.testing.assert_close(t_d.cpu(), t_c, rtol=0, atol=0, equal_nan=True)
    # the source is untouched
    torch.testing.assert_close(s_d.cpu(), s_c, rtol=0, atol=0, equal_nan=True)


@SETTINGS
@given(src=placed(["cpu"] + _devices(), allow_overlap=True), to_device=st.sampled_from(["cpu"] + _devices()),
       dtype=st.sampled_from(DTYPES), to_dtype=st.sampled_from([None] + DTYPES), copy=st.booleans(),
       memory_format=st.sampled_from([torch.preserve_format, torch.contiguous_format]))
def test_to_matches_cpu(src, to_device, dtype, to_dtype, copy, memory_format):
    shape, layout, device = src
    s_d = _build(shape, layout, device, dtype, 3)
    s_c = _build(shape, layout, "cpu", dtype, 3)
    kwargs = dict(copy=copy, memory_format=memory_format)
    r_d = s_d.to(to_device, to_dtype, **kwargs) if to_dtype else s_d.to(to_device, **kwargs)
    r_c = s_c.to(to_dtype, **kwargs) if to_dtype else s_c.to("cpu", **kwargs)
    assert r_d.device == torch.device(to_device)
    assert r_d.dtype == r_c.dtype and r_d.shape == r_c.shape
    if torch.device(to_device) == s_d.device:
        # .to within a device returns self exactly when the CPU's .to within the CPU does
        assert (r_d is s_d) == (r_c is s_c), f"returned self: neuron {r_d is s_d}, CPU {r_c is s_c}"
    else:
        assert r_d.numel() == 0 or r_d.untyped_storage().data_ptr() != s_d.untyped_storage().data_ptr()
    if r_d is not s_d and r_c.numel() > 1:
        # a copy has the layout the CPU gives the same copy
        ref = s_c.to(to_dtype or dtype, copy=True, memory_format=memory_format)
        assert r_d.stride() == ref.stride(), f"strides {r_d.stride()} vs CPU {ref.stride()}"
    torch.testing.assert_close(r_d.cpu(), r_c, rtol=0, atol=0, equal_nan=True)


@SETTINGS
@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.int64, torch.complex64, torch.bool]),
       device=st.sampled_from(_devices()), rounds=st.integers(1, 4))
def test_writes_through_views_reach_the_base_and_copies_do_not(data, shape, dtype, device, rounds):
    base_c = _shaped(shape, dtype)
    base_d = base_c.to(device)
    clone_d, clone_c = base_d.clone(), base_c.clone()
    for _ in range(rounds):
        dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
        start = data.draw(st.integers(0, shape[dim] - 1), label="start")
        step = data.draw(st.integers(1, 2), label="step")
        transpose = data.draw(st.booleans(), label="transpose")

        def view(x):
            v = x.narrow(dim, start, shape[dim] - start)[(slice(None),) * dim + (slice(None, None, step),)]
            return v.mT if transpose and v.dim() >= 2 else v
        value = data.draw(st.integers(-5, 5), label="value")
        v_c, v_d = view(base_c), view(base_d)
        src = _values(v_c.numel(), dtype, value).reshape(v_c.shape)
        v_c.copy_(src)
        v_d.copy_(src.to(device))
        _same(base_d, base_c, "base after writing a view")
        cont_d = v_d.contiguous()  # a copy when the view is not contiguous
        if not v_d.is_contiguous():
            cont_d.zero_()
            _same(base_d, base_c, "base after writing a contiguous() copy")
    _same(clone_d, clone_c, "clone untouched by writes to its source")


# ---- memory --------------------------------------------------------------------------------------

def test_allocate_compute_free_loop_returns_memory_to_start():
    devices = _devices()
    gc.collect()
    start = {d: torch.neuron.memory_allocated(d) for d in devices}
    peak = dict(start)
    g = torch.Generator().manual_seed(0)
    for i in range(300):
        dev = devices[i % len(devices)]
        n = int(torch.randint(2, 64, (1,), generator=g))
        a = torch.randn(n, n + 1, generator=g).to(dev).requires_grad_()
        b = torch.randn(n + 1, 7, generator=g).to(dev)
        out = (a @ b).relu()[::2].t().contiguous()
        out.sum().backward()
        views = [a.detach()[1:], a.detach().mT, a.detach().as_strided((2, 2), (1, 1))]
        c = torch.empty(0, device=dev)
        c.resize_(n * 3)
        c.copy_(torch.arange(n * 3, dtype=torch.float32))
        moved = c.to(devices[(i + 1) % len(devices)]).to("cpu").to(dev)
        idx = torch.randperm(n, generator=g).to(dev)
        picked = a.detach()[idx].index_add_(0, idx, a.detach()[idx])
        peak[dev] = max(peak[dev], torch.neuron.memory_allocated(dev))
        del a, b, out, views, c, moved, idx, picked
    gc.collect()
    for d in devices:
        assert torch.neuron.memory_allocated(d) == start[d], (
            f"{d}: {torch.neuron.memory_allocated(d) - start[d]} bytes still allocated after the loop")
        assert peak[d] > start[d]
