"""A self-contained HTML view of a memory snapshot, readable offline.

:func:`render_html` takes a snapshot in PyTorch's structure (the dictionary
``torch.neuron.memory._snapshot()`` returns, like ``torch.cuda.memory._snapshot()``) and
returns one HTML page with everything inline: SVG drawings, a small script for hovering and
selecting, and the styles. The page loads nothing when it opens, so it works without a network.

For each device it draws

- the *active memory timeline*: the allocator's actions in the order it recorded them, each
  allocation a band that lives from its ``alloc`` to its ``free_completed``, stacked on the
  allocations below it (a band drops when one below it is freed), its height its size; a dashed
  line follows the memory reserved by segments. Hovering a band shows its size, address, the
  actions that made and freed it and the top Python and C++ frames of its traceback; a click
  keeps it shown;
- the *segments and blocks* of the snapshot's state: each segment a bar (in address order,
  wrapping over rows, lengths proportional to sizes), its blocks inside, allocated or cached;
- a summary: memory allocated and reserved, the peak of allocated memory over the recorded
  actions and the number of allocations.

A page address ending in ``#band=D:I`` opens with band ``I`` of device ``D`` selected.

Long traces are cut to their newest :data:`MAX_ACTIONS` actions for drawing (the page says so);
the summary counts them all.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .._units import format_bytes

__all__ = ["MAX_ACTIONS", "DeviceSummary", "render_html", "summarize"]

#: The newest actions of a device's trace that the timeline draws.
MAX_ACTIONS = 20_000
#: Segments drawn per device in the segment view (the largest when there are more).
MAX_SEGMENTS = 5_000
#: Python and C++ frames kept with an allocation for the page (the innermost ones).
FRAMES_SHOWN = 8
CPP_FRAMES_SHOWN = 5

_MAX_VERTICES = 400_000 # band outline vertices per device before the grid coarsens
_PLOT_W = 1100          # timeline plot area, pixels
_PLOT_H = 380
_LEFT = 78              # room for the memory axis labels
_TOP = 12
_BOTTOM = 34
_SEG_W = 1100           # segment map width
_SEG_ROW_H = 16
_SEG_GAP = 4            # between rows
_SEG_ROWS = 24          # rows the reserved memory is spread over (about)

# Leading C++ frames that belong to taking the traceback itself, not to the program.
_CAPTURE_FRAMES = ("torch::unwind", "torch::CapturedTraceback")


@dataclass
class DeviceSummary:
    """The numbers of one device that the page's summary shows.

    Args:
        device: device index.
        allocated: bytes of blocks a tensor holds in the snapshot's state.
        reserved: bytes of all segments in the snapshot's state.
        segments: number of segments.
        peak: highest allocated bytes over the recorded actions (``None`` with no actions).
        allocations: number of ``alloc`` actions in the trace.
        actions: number of entries in the trace.
        ooms: number of ``oom`` actions.
    """

    device: int
    allocated: int
    reserved: int
    segments: int
    peak: Optional[int]
    allocations: int
    actions: int
    ooms: int


def _is_allocated(block: dict) -> bool:
    return str(block.get("state", "")).startswith("active")


def _device_list(snapshot: dict) -> list[int]:
    devices = set(range(len(snapshot.get("device_traces", []))))
    devices.update(int(s.get("device", 0)) for s in snapshot.get("segments", []))
    return sorted(devices)


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces", [])
    return list(traces[device]) if device < len(traces) else []


def _segments(snapshot: dict, device: int) -> list[dict]:
    return [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]


def _final_allocated(segments: list[dict]) -> int:
    return sum(int(b["size"]) for s in segments for b in s.get("blocks", []) if _is_allocated(b))


def summarize(snapshot: dict) -> list[DeviceSummary]:
    """The summary of each device of ``snapshot`` (see :class:`DeviceSummary`).

    The peak walks the whole trace backwards from the state's allocated bytes: before an
    ``alloc`` there was its size less, before a ``free_completed`` its size more.
    """
    out = []
    for device in _device_list(snapshot):
        segments = _segments(snapshot, device)
        trace = _trace(snapshot, device)
        allocated = _final_allocated(segments)
        peak: Optional[int] = None
        if trace:
            running = peak = allocated
            for entry in reversed(trace):
                action = entry.get("action")
                if action == "alloc":
                    running -= int(entry.get("size", 0))
                elif action == "free_completed":
                    running += int(entry.get("size", 0))
                peak = max(peak, running)
        out.append(DeviceSummary(
            device=device,
            allocated=allocated,
            reserved=sum(int(s.get("total_size", 0)) for s in segments),
            segments=len(segments),
            peak=peak,
            allocations=sum(1 for e in trace if e.get("action") == "alloc"),
            actions=len(trace),
            ooms=sum(1 for e in trace if e.get("action") == "oom"),
        ))
    return out


def _bytes(n: float) -> str:
    return format_bytes(n, digits=1)


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    parts = path.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else path


class _Frames:
    """Interns frame lines so each is written once in the page's data."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._index: dict[str, int] = {}

    def _intern(self, line: str) -> int:
        i = self._index.get(line)
        if i is None:
            i = self._index[line] = len(self.lines)
            self.lines.append(line)
        return i

    def pick(self, frames: Any) -> list:
        """``[python frame ids, c++ frame ids, frames not shown]`` of a traceback, innermost first."""
        python: list[int] = []
        cpp: list[int] = []
        hidden = 0
        for f in frames or []:
            name = str(f.get("name", "?"))
            filename = str(f.get("filename", "??"))
            if filename.endswith(".py"):
                if len(python) < FRAMES_SHOWN:
                    python.append(self._intern(f"{name}  {_short_path(filename)}:{f.get('line', 0)}"))
                else:
                    hidden += 1
            elif not cpp and name.startswith(_CAPTURE_FRAMES):
                continue
            elif len(cpp) < CPP_FRAMES_SHOWN:
                where = "" if filename in ("??", "") else f"  {_short_path(filename)}:{f.get('line', 0)}"
                if len(name) > 110 and "(" in name:      # long C++ signatures: the name, not the arguments
                    name = name[:name.index("(")] + "(...)" + name[name.rindex(")") + 1:]
                cpp.append(self._intern(name + where))
            else:
                hidden += 1
        return [python, cpp, hidden]


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round axis step (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks over ``span``.

    The trace view (:mod:`~torchneuron.tools.traceviz`) draws its time axis with it too.
    """
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag  # pragma: no cover


@dataclass
class _Band:
    size: int
    addr: int
    start: int                # step of its alloc (0 for a band alive before the drawn actions)
    pre: bool                 # alive before the drawn actions
    frames: list
    free_frames: Optional[list] = None
    end: Optional[int] = None
    alloc_action: Optional[int] = None   # index in the trace
    free_action: Optional[int] = None
    verts: list = field(default_factory=list)  # (x pixel, bottom offset in bytes) at each change


def _timeline(trace: list[dict], segments: list[dict], frames: _Frames, first_index: int,
              column_px: float = 1.0) -> dict:
    """Stack the allocations of ``trace`` (the drawn window) into bands with their outlines.

    The x axis counts the actions that change the stack (``alloc``, ``free_completed``). A
    band's outline changes only when a band below it is freed; within one pixel column the
    changes are gathered and drawn once, so a band has at most two vertices per column.
    """
    final_alive = {}
    for s in segments:
        for b in s.get("blocks", []):
            if _is_allocated(b):
                final_alive[int(b["address"])] = (int(b["size"]), b.get("frames", []))
    # Which blocks were alive before the window: walk it backwards from the state.
    alive = dict(final_alive)
    freed_first: dict[int, int] = {}
    free_frames_of: dict[int, Any] = {}
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        action, addr = e.get("action"), int(e.get("addr", 0))
        if action == "alloc":
            alive.pop(addr, None)
        elif action == "free_completed":
            alive[addr] = (int(e.get("size", 0)), None)
            freed_first[addr] = i
            free_frames_of[addr] = e.get("frames", [])
    steps = sum(1 for e in trace if e.get("action") in ("alloc", "free_completed"))
    n = max(steps, 1)

    def x_of(step: int) -> float:
        return _LEFT + step * _PLOT_W / n

    bands: list[_Band] = []
    stack: list[int] = []       # band ids, bottom first
    offsets: list[int] = []     # bottom offset of stack[p], valid for p < valid
    state = {"valid": 0, "dirty": 0, "total": 0}

    def settle(upto: int) -> None:
        for p in range(state["valid"], upto + 1):
            offsets[p] = offsets[p - 1] + bands[stack[p - 1]].size if p else 0
        state["valid"] = max(state["valid"], upto + 1)

    tol = [0.0]

    def place(band: _Band, offset: int, x: float) -> None:
        if not band.verts:
            band.verts.append((x_of(band.start), offset))
        elif abs(band.verts[-1][1] - offset) > tol[0]:
            if band.verts[-1][0] == x and len(band.verts) >= 2 and band.verts[-2][0] == x:
                band.verts[-1] = (x, offset)
            else:
                band.verts.append((x, band.verts[-1][1]))
                band.verts.append((x, offset))

    def flush(x: float) -> None:
        if stack:
            settle(len(stack) - 1)
        for p in range(state["dirty"], len(stack)):
            place(bands[stack[p]], offsets[p], x)
        state["dirty"] = len(stack)

    def push(band: _Band) -> None:
        bands.append(band)
        stack.append(len(bands) - 1)
        offsets.append(0)
        state["dirty"] = min(state["dirty"], len(stack) - 1)
        state["total"] += band.size

    # Bands alive before the window, the longest-lived at the bottom.
    order = sorted(alive, key=lambda a: -freed_first.get(a, len(trace)))
    for addr in order:
        size, block_frames = alive[addr]
        push(_Band(size=size, addr=addr, start=0, pre=True,
                   frames=frames.pick(block_frames) if block_frames is not None else [[], [], 0]))
    live = {bands[i].addr: i for i in stack}
    peak = state["total"]

    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    for e in trace:
        if e.get("action") == "segment_alloc":
            reserved -= int(e.get("size", 0))
        elif e.get("action") == "segment_free":
            reserved += int(e.get("size", 0))
    # The scale, known before drawing: a band's outline gets a vertex only when it moved by half a
    # pixel or more, so that a long trace of small frees under big allocations stays a small page.
    running = high = state["total"]
    top_reserved = r = reserved
    for e in trace:
        action, size = e.get("action"), int(e.get("size", 0))
        running += size if action == "alloc" else -size if action == "free_completed" else 0
        r += size if action == "segment_alloc" else -size if action == "segment_free" else 0
        high, top_reserved = max(high, running), max(top_reserved, r)
    tol[0] = 0.5 * _y_scale(high, top_reserved)[0] / _PLOT_H
    reserved_pts = [(x_of(0), reserved)]
    max_reserved = reserved
    ooms = []

    step = 0
    column = 0
    last_x = x_of(0)
    for i, e in enumerate(trace):
        action = e.get("action")
        if action in ("segment_alloc", "segment_free"):
            reserved += int(e.get("size", 0)) * (1 if action == "segment_alloc" else -1)
            reserved_pts.append((x_of(step), reserved))
            max_reserved = max(max_reserved, reserved)
            continue
        if action == "oom":
            ooms.append({"x": x_of(step), "size": int(e.get("size", 0)),
                         "free": int(e.get("device_free", 0)), "action": first_index + i})
            continue
        if action not in ("alloc", "free_completed"):
            continue
        step += 1
        x = x_of(step)
        if int(x / column_px) != column:
            flush(last_x)
            column = int(x / column_px)
        last_x = x
        addr, size = int(e.get("addr", 0)), int(e.get("size", 0))
        if action == "alloc":
            band = _Band(size=size, addr=addr, start=step, pre=False, frames=frames.pick(e.get("frames")),
                         alloc_action=first_index + i)
            push(band)
            live[addr] = len(bands) - 1
            peak = max(peak, state["total"])
        else:
            b = live.pop(addr, None)
            if b is None:
                continue
            p = stack.index(b)
            settle(p)
            place(bands[b], offsets[p], x)
            bands[b].end = step
            bands[b].free_action = first_index + i
            bands[b].free_frames = frames.pick(e.get("frames"))
            stack.pop(p)
            offsets.pop(p)
            state["valid"] = min(state["valid"], p)
            state["dirty"] = min(state["dirty"], p)
            state["total"] -= bands[b].size
    flush(last_x)
    vertices = sum(len(b.verts) for b in bands)
    return {"bands": bands, "vertices": vertices, "steps": steps, "x_of": x_of, "peak": peak, "reserved": reserved_pts,
            "max_reserved": max_reserved, "ooms": ooms}


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _outline(points: list) -> str:
    """A closed SVG path through ``points`` (formatted coordinates), with H and V for the steps."""
    (x0, y0), parts = points[0], [f"M{points[0][0]},{points[0][1]}"]
    for x, y in points[1:]:
        if y == y0 and x != x0:
            parts.append(f"H{x}")
        elif x == x0 and y != y0:
            parts.append(f"V{y}")
        elif (x, y) != (x0, y0):
            parts.append(f"L{x},{y}")
        x0, y0 = x, y
    return "".join(parts) + "Z"


def _y_scale(peak: int, max_reserved: int) -> tuple:
    """The top of the memory axis and its tick step, in bytes."""
    top = max(peak, max_reserved, 1)
    # A cache much larger than the tensors would flatten the bands: then the reserved line is cut.
    scale_top = top if max_reserved <= 2 * max(peak, 1) else max(peak, 1)
    unit = 1 << (10 * min(3, max(0, int(math.log(max(scale_top, 1), 1024)))))
    step_b = _nice_step(scale_top * 1.04 / unit) * unit   # round steps of KiB, MiB or GiB
    return step_b * math.ceil(scale_top * 1.04 / step_b), step_b


def _timeline_svg(device: int, tl: dict, data: dict) -> str:
    bands: list[_Band] = tl["bands"]
    ymax, step_b = _y_scale(tl["peak"], tl["max_reserved"])
    sy = _PLOT_H / ymax

    def y(v: float) -> float:
        return _TOP + _PLOT_H - v * sy

    x_end = _LEFT + _PLOT_W
    out = [f'<svg class="timeline" width="{_LEFT + _PLOT_W + 20}" height="{_TOP + _PLOT_H + _BOTTOM}" '
           f'data-device="{device}">']
    out.append(f'<rect class="plot" x="{_LEFT}" y="{_TOP}" width="{_PLOT_W}" height="{_PLOT_H}"/>')
    v = 0.0
    while v <= ymax + 1e-9:
        yy = _f(y(v))
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{x_end}" y1="{yy}" y2="{yy}"/>'
                   f'<text class="tick" x="{_LEFT - 6}" y="{yy}" text-anchor="end" dy="4">'
                   f'{html.escape(_bytes(v))}</text>')
        v += step_b
    if tl["steps"]:
        xs = _nice_step(tl["steps"], 8)
        s = 0.0
        while s <= tl["steps"] + 1e-9:
            xx = _f(tl["x_of"](s))
            out.append(f'<text class="tick" x="{xx}" y="{_TOP + _PLOT_H + 16}" text-anchor="middle">{int(s)}</text>')
            s += xs
    out.append(f'<text class="axis" x="{_LEFT + _PLOT_W / 2}" y="{_TOP + _PLOT_H + 31}" text-anchor="middle">'
               'allocator actions (alloc, free), oldest to newest</text>')
    out.append('<g class="bands">')
    table = []
    for i, b in enumerate(bands):
        end_x = tl["x_of"](b.end if b.end is not None else tl["steps"])
        last = b.verts[-1][1] if b.verts else 0
        bottom = [(_f(px), _f(y(o))) for px, o in b.verts] + [(_f(end_x), _f(y(last)))]
        top = [(_f(px), _f(y(o + b.size))) for px, o in reversed(b.verts)]
        top.insert(0, (_f(end_x), _f(y(last + b.size))))
        d = _outline(bottom + top)
        hue = (i * 137.508) % 360
        fill = f"hsl({hue:.0f},{28 if b.pre else 62}%,{70 if b.pre else 60}%)"
        cls = "band pre" if b.pre else "band"
        out.append(f'<path class="{cls}" data-i="{i}" data-size="{b.size}" fill="{fill}" d="{d}"/>')
        table.append([b.size, f"0x{b.addr:x}", b.alloc_action, b.free_action, b.frames, b.free_frames, int(b.pre)])
    out.append('</g>')
    if tl["max_reserved"] > 0:
        pts = []
        prev = None
        for px, r in tl["reserved"]:
            if prev is not None:
                pts.append(f"{_f(px)},{_f(max(y(prev), _TOP))}")
            pts.append(f"{_f(px)},{_f(max(y(r), _TOP))}")
            prev = r
        pts.append(f"{_f(x_end)},{_f(max(y(prev), _TOP))}")
        out.append(f'<polyline class="reserved" points="{" ".join(pts)}"><title>memory reserved by segments'
                   f'</title></polyline>')
    for o in tl["ooms"]:
        xx = _f(o["x"])
        out.append(f'<line class="oom" x1="{xx}" x2="{xx}" y1="{_TOP}" y2="{_TOP + _PLOT_H}">'
                   f'<title>out of memory (action {o["action"]}): tried to allocate {html.escape(_bytes(o["size"]))}'
                   f' with {html.escape(_bytes(o["free"]))} free on the device</title></line>'
                   f'<text class="oomlabel" x="{xx}" y="{_TOP + 12}" dx="3">OOM</text>')
    out.append('</svg>')
    data["bands"] = table
    return "".join(out)


def _segments_svg(device: int, segments: list[dict], frames: _Frames, data: dict) -> tuple[str, str]:
    segs = sorted(segments, key=lambda s: int(s.get("address", 0)))
    note = ""
    if len(segs) > MAX_SEGMENTS:
        keep = sorted(segs, key=lambda s: -int(s.get("total_size", 0)))[:MAX_SEGMENTS]
        keep_ids = {id(s) for s in keep}
        note = (f"{len(segs) - MAX_SEGMENTS} of the smallest segments are not drawn "
                f"(only the {MAX_SEGMENTS} largest are).")
        segs = [s for s in segs if id(s) in keep_ids]
    total = sum(int(s.get("total_size", 0)) for s in segs)
    min_w, gap = 3.0, 2.0
    # Bytes per pixel so that the segments spread over about _SEG_ROWS rows.
    room = _SEG_W * _SEG_ROWS - len(segs) * (min_w + gap)
    bpp = total / room if room > 0 and total else (total / (_SEG_W * _SEG_ROWS) if total else 1.0)
    bpp = max(bpp, 1e-9)
    rects = []
    table = []
    rows_used = [0]

    def span(cls: str, attrs: str, p0: float, w: float) -> None:
        """Draw [p0, p0 + w) of the strip, which wraps every _SEG_W pixels onto the next row."""
        w = max(w, 0.5)
        while w > 1e-6:
            row, x0 = divmod(p0, _SEG_W)
            piece = min(w, _SEG_W - x0)
            rects.append(f'<rect class="{cls}" {attrs} x="{_f(x0)}" y="{int(row) * (_SEG_ROW_H + _SEG_GAP)}" '
                         f'width="{_f(piece)}" height="{_SEG_ROW_H}"/>')
            rows_used[0] = max(rows_used[0], int(row) + 1)
            p0 += piece
            w -= piece

    pos = 0.0
    for si, s in enumerate(segs):
        size = int(s.get("total_size", 0))
        w = max(size / bpp, min_w)
        blocks = sorted(s.get("blocks", []), key=lambda b: int(b.get("address", 0)))
        seg_entry = [f"0x{int(s.get('address', 0)):x}", size, str(s.get("segment_type", "")),
                     s.get("stream", 0), bool(s.get("adopted", False)), []]
        table.append(seg_entry)
        bx = pos
        for bi, b in enumerate(blocks):
            bw = w * int(b.get("size", 0)) / size if size else w / len(blocks)
            seg_entry[5].append([f"0x{int(b.get('address', 0)):x}", int(b.get("size", 0)),
                                 int(b.get("requested_size", 0) or 0), str(b.get("state", "")),
                                 frames.pick(b.get("frames"))])
            span("blk alloc" if _is_allocated(b) else "blk cached", f'data-s="{si}" data-b="{bi}"', bx, bw)
            bx += bw
        span("seg", f'data-s="{si}"', pos, w)
        pos += w + gap
    height = rows_used[0] * (_SEG_ROW_H + _SEG_GAP)
    data["segments"] = table
    svg = (f'<svg class="segmap" width="{_SEG_W + 2}" height="{max(height, 1)}" data-device="{device}">'
           + "".join(rects) + "</svg>")
    return svg, note


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:18px 24px;color:#1d2329;background:#fff}
h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:22px 0 6px}h3{font-size:15px;margin:16px 0 4px}
.muted{color:#5f6b76}.note{background:#fff6dc;border:1px solid #ecd58c;padding:6px 10px;border-radius:4px;margin:6px 0}
table.summary{border-collapse:collapse;margin:6px 0}table.summary td,table.summary th{border-bottom:1px solid #dde2e6;padding:3px 12px;text-align:right}
table.summary th:first-child,table.summary td:first-child{text-align:left}
.plot{fill:#fafbfc;stroke:#c9d1d8}.grid{stroke:#e6eaee}.tick{font-size:11px;fill:#5f6b76}.axis{font-size:12px;fill:#3b444c}
.band{stroke:rgba(0,0,0,.18);stroke-width:.3}.band:hover,.band.sel{stroke:#000;stroke-width:1.4}
.bands.dim .band:not(.sel){opacity:.4}
.reserved{fill:none;stroke:#8a3ffc;stroke-dasharray:5 3;stroke-width:1.3}
.oom{stroke:#d62728;stroke-width:2}.oomlabel{fill:#d62728;font-size:11px;font-weight:600}
.seg{fill:none;stroke:#55606a;stroke-width:.8}.blk.alloc{fill:#3d85c6}.blk.cached{fill:#cfd6dc}
.blk:hover,.blk.sel{fill:#f0a030}
.legend span{display:inline-block;margin-right:16px}.sw{display:inline-block;width:12px;height:12px;vertical-align:-1px;margin-right:4px;border:1px solid #889}
#info{position:fixed;right:14px;top:14px;width:430px;max-height:calc(100vh - 40px);overflow:auto;background:#fffffff2;border:1px solid #b9c2ca;border-radius:6px;padding:8px 12px;font-size:12.5px;box-shadow:0 2px 10px rgba(0,0,0,.12);display:none}
#info .k{color:#5f6b76}#info ol{margin:2px 0 6px;padding-left:20px}#info li{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11.5px;word-break:break-all}
select{font-size:14px}
"""

_SCRIPT = r"""
(function(){
var D=JSON.parse(document.getElementById('memviz-data').textContent);
var info=document.getElementById('info'),pinned=null;
function esc(s){return String(s).replace(/[&<>"]/g,function(c){return{'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
function fmt(n){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(Math.abs(n)>=1024&&i<4){n/=1024;i++;}return i?n.toFixed(n<100?1:0)+' '+u[i]:n+' B';}
function frames(f,label){if(!f)return '';var s='';
 if(f[0].length)s+='<div class="k">'+label+'Python frames, innermost first</div><ol>'+f[0].map(function(i){return '<li>'+esc(D.frames[i])+'</li>';}).join('')+'</ol>';
 if(f[1].length)s+='<div class="k">'+label+'C++ frames, innermost first</div><ol>'+f[1].map(function(i){return '<li>'+esc(D.frames[i])+'</li>';}).join('')+'</ol>';
 if(f[2])s+='<div class="k">'+f[2]+' more frames not shown</div>';
 if(!f[0].length&&!f[1].length)s+='<div class="k">'+label+'no frames recorded</div>';return s;}
function band(dev,i){var b=D.devices[dev].bands[i];
 var s='<b>allocation</b> '+fmt(b[0])+' <span class="k">('+b[0]+' bytes)</span><br><span class="k">address</span> '+b[1]+'<br>';
 s+=b[6]?'<span class="k">allocated before the drawn actions</span><br>':'<span class="k">allocated at action</span> '+b[2]+'<br>';
 s+=b[3]===null?'<span class="k">still allocated when the snapshot was taken</span><br>':'<span class="k">freed at action</span> '+b[3]+'<br>';
 s+=frames(b[4],b[6]&&!b[4][0].length&&!b[4][1].length?'allocation: ':'')+(b[5]?frames(b[5],'free: '):'');return s;}
function block(dev,si,bi){var g=D.devices[dev].segments[si];
 var s='<b>segment</b> '+g[0]+' <span class="k">'+fmt(g[1])+', '+esc(g[2])+', stream '+esc(g[3])+(g[4]?', adopted':'')+', '+g[5].length+' block(s)</span><br>';
 if(bi!==null){var b=g[5][bi];s+='<b>block</b> '+b[0]+' '+fmt(b[1])+' <span class="k">('+(b[3].indexOf('active')===0?'allocated':'cached')+', '+esc(b[3])+', requested '+fmt(b[2])+')</span><br>'+frames(b[4],'');}
 return s;}
function show(el){var dev=el.closest('section').getAttribute('data-device'),h;
 if(el.classList.contains('band'))h=band(dev,+el.getAttribute('data-i'));
 else h=block(dev,+el.getAttribute('data-s'),el.hasAttribute('data-b')?+el.getAttribute('data-b'):null);
 info.innerHTML=(pinned?'<div class="k">selected (click again to release)</div>':'<div class="k">hover; click to keep</div>')+h;info.style.display='block';}
document.addEventListener('mouseover',function(ev){if(pinned)return;var el=ev.target;if(el.classList&&(el.classList.contains('band')||el.classList.contains('blk')||el.classList.contains('seg')))show(el);});
function pin(el){if(pinned){pinned.classList.remove('sel');pinned.parentNode.classList.remove('dim');}
 pinned=el;if(el){el.classList.add('sel');if(el.classList.contains('band'))el.parentNode.classList.add('dim');}}
document.addEventListener('click',function(ev){var el=ev.target,prev=pinned;if(!(el.classList&&(el.classList.contains('band')||el.classList.contains('blk')||el.classList.contains('seg'))))return;
 if(pinned){pin(null);if(prev===el)return;}pin(el);show(el);});
var m=/^#band=(\d+):(\d+)$/.exec(location.hash);
if(m){var s0=document.querySelector('section.device[data-device="'+m[1]+'"]');var el=s0&&s0.querySelector('.band[data-i="'+m[2]+'"]');
 if(el){document.querySelectorAll('section.device').forEach(function(s){s.style.display=s===s0?'':'none';});pin(el);show(el);}}
var sel=document.getElementById('device');if(sel&&m)sel.value=m[1];if(sel){sel.addEventListener('change',function(){
 document.querySelectorAll('section.device').forEach(function(s){s.style.display=s.getAttribute('data-device')===sel.value?'':'none';});
 pin(null);info.style.display='none';});}
})();
"""


def render_html(snapshot: dict, *, title: str = "memory snapshot", max_actions: int = MAX_ACTIONS) -> str:
    """The self-contained HTML page of ``snapshot`` (nothing in it is fetched when it opens).

    Args:
        snapshot: a memory snapshot in PyTorch's structure (``segments``, ``device_traces``).
        title: shown in the page's heading and title (e.g. the snapshot's file name).
        max_actions: the newest actions of each device's trace that the timeline draws.
    """
    summaries = summarize(snapshot)
    frames = _Frames()
    data: dict[str, Any] = {"devices": {}}
    sections = []
    shown = [s for s in summaries if s.actions or s.segments]
    for summary in shown:
        device = summary.device
        trace = _trace(snapshot, device)
        segments = _segments(snapshot, device)
        dev_data: dict[str, Any] = {}
        parts = [f'<section class="device" data-device="{device}"'
                 + (' style="display:none"' if summary is not shown[0] else "") + ">",
                 f"<h2>neuron:{device}</h2>"]
        parts.append("<h3>Active memory timeline</h3>")
        if not trace:
            parts.append('<p class="note">No allocator actions were recorded for this device: memory history '
                         "recording was off while it allocated (turn it on with "
                         "<code>torch.neuron.memory._record_memory_history()</code> before the code to look at). "
                         "The segments below are the allocator's state when the snapshot was taken.</p>")
            dev_data["bands"] = []
        else:
            first = max(0, len(trace) - max_actions)
            window = trace[first:]
            if first:
                parts.append(f'<p class="note">The trace has {len(trace):,} actions; the timeline draws the newest '
                             f"{len(window):,} (actions {first:,} to {len(trace) - 1:,}). Allocations made before "
                             "them and still alive are drawn from the left edge.</p>")
            tl = _timeline(window, segments, frames, first)
            column_px = 1.0
            while tl["vertices"] > _MAX_VERTICES and column_px < 16:
                # Outlines that change in every column (many frees under many live blocks): draw
                # their steps on a coarser grid rather than write a page of tens of megabytes.
                column_px *= 2
                tl = _timeline(window, segments, _Frames(), first, column_px)
            if column_px > 1:
                tl = _timeline(window, segments, frames, first, column_px)
                parts.append(f'<p class="note">Many allocations move at once in this trace: band outlines '
                             f"are drawn on a grid of {column_px:g} pixels.</p>")
            n_alloc = sum(1 for b in tl["bands"] if not b.pre)
            n_pre = len(tl["bands"]) - n_alloc
            parts.append(
                f'<p class="muted">{n_alloc:,} allocations'
                + (f" and {n_pre:,} allocated before the drawn actions (paler)" if n_pre else "")
                + "; each band is one allocation, its height its size, stacked in the order of the trace; "
                "hover a band for its size, address and traceback, click to keep it.</p>")
            parts.append(_timeline_svg(device, tl, dev_data))
            parts.append('<div class="legend muted"><span><svg width="26" height="10"><line x1="0" x2="26" y1="5" '
                         'y2="5" class="reserved"/></svg> reserved by segments</span>'
                         + (f"<span>peak of the drawn actions: {_bytes(tl['peak'])}</span>")
                         + ("<span>the reserved line is cut at the top: the cache is over twice the peak</span>"
                            if tl["max_reserved"] > 2 * max(tl["peak"], 1) else "")
                         + "</div>")
        parts.append("<h3>Segments and blocks (state when the snapshot was taken)</h3>")
        if segments:
            svg, note = _segments_svg(device, segments, frames, dev_data)
            cached = summary.reserved - summary.allocated
            parts.append(f'<p class="muted">{summary.segments:,} segments in address order, lengths proportional '
                         "to their sizes (at least a few pixels), wrapping over rows. "
                         f'<span class="sw" style="background:#3d85c6"></span>allocated {_bytes(summary.allocated)}'
                         f' &nbsp;<span class="sw" style="background:#cfd6dc"></span>cached {_bytes(cached)}</p>')
            if note:
                parts.append(f'<p class="note">{html.escape(note)}</p>')
            parts.append(svg)
        else:
            parts.append('<p class="muted">No segments: the allocator holds no memory on this device.</p>')
            dev_data["segments"] = []
        parts.append("</section>")
        data["devices"][str(device)] = dev_data
        sections.append("".join(parts))
    data["frames"] = frames.lines

    rows = []
    for s in summaries:
        peak = "" if s.peak is None else str(s.peak)
        rows.append(
            f'<tr data-device="{s.device}" data-allocated="{s.allocated}" data-reserved="{s.reserved}" '
            f'data-peak="{peak}" data-allocations="{s.allocations}" data-segments="{s.segments}" '
            f'data-ooms="{s.ooms}">'
            f"<td>neuron:{s.device}</td><td>{_bytes(s.allocated)}</td><td>{_bytes(s.reserved)}</td>"
            f"<td>{s.segments:,}</td><td>{'recording off' if s.peak is None else _bytes(s.peak)}</td>"
            f"<td>{s.allocations:,}</td><td>{s.actions:,}</td><td>{s.ooms}</td></tr>")
    selector = ""
    if len(shown) > 1:
        selector = ('<p>Device: <select id="device">'
                    + "".join(f'<option value="{s.device}">neuron:{s.device}</option>' for s in shown)
                    + "</select></p>")
    body = "".join(sections) if sections else (
        '<p class="note">Nothing to draw: no device holds memory and no allocator actions were recorded.</p>')
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title_text = html.escape(title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title_text}: device memory</title><style>{_STYLE}</style></head><body>"
        f"<h1>Device memory: {title_text}</h1>"
        '<table class="summary"><tr><th>device</th><th>allocated</th><th>reserved</th><th>segments</th>'
        "<th>peak allocated (trace)</th><th>allocations (trace)</th><th>actions (trace)</th><th>OOMs</th></tr>"
        + "".join(rows) + "</table>"
        '<p class="muted">allocated and reserved: the allocator\'s state when the snapshot was taken; '
        "peak and allocations: over the recorded actions.</p>"
        + selector + body
        + '<div id="info"></div>'
        f'<script type="application/json" id="memviz-data">{payload}</script>'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
