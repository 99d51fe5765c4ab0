"""A self-contained HTML timeline of a Chrome trace (the JSON ``torch.profiler`` exports).

:func:`render_html` draws a trace in the Trace Event Format as one HTML page with an inline
SVG and a small script, and loads nothing when it opens: each process a group (its name from
the ``process_name`` metadata, e.g. the host program and ``neuron 0``), each of its threads a
lane (``thread_name``: the host thread, ``stream 0``), slices nested by time under their
callers with their names, and flow arrows (``s``/``f`` events, e.g. each launch to its kernel,
or the ``fwdbwd`` links from a forward op to its backward). Hovering a slice shows its name,
start, duration and arguments; a click highlights its flows.

It draws complete (``X``) slices and ``B``/``E`` pairs; instant and counter events are counted,
not drawn. A time window (``window_ms``, or the slice named ``ProfilerStep#N`` that PyTorch's
profiler writes for a step) keeps the drawing readable; slices under half a pixel wide are left
out of the drawing and counted.
"""

from __future__ import annotations

import bisect
import html
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .memviz import _nice_step

__all__ = ["load_trace", "render_html", "TraceError"]

_LABEL_W = 230      # lane names
_ROW_H = 15         # one nesting level
_AXIS_H = 26
_PROC_H = 20        # a process's heading
_LANE_GAP = 6
_MIN_PX = 0.5       # narrower slices are not drawn
_MAX_DEPTH = 60


class TraceError(ValueError):
    """The file is not a Chrome trace."""


def load_trace(path: str) -> list[dict]:
    """The events of the Chrome trace at ``path`` (a JSON object with ``traceEvents``, or a list)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"cannot read {path}: {e}") from e
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path} is not a Chrome trace (no 'traceEvents' list)")
    return [e for e in events if isinstance(e, dict)]


@dataclass
class _Slice:
    name: str
    ts: float
    dur: float
    cat: str
    args: Any
    depth: int = 0
    index: int = -1             # drawn slices get an index in the page's table


@dataclass
class _Lane:
    pid: Any
    tid: Any
    name: str
    sort: float
    slices: list = field(default_factory=list)
    y: float = 0.0
    rows: dict = field(default_factory=dict)    # nesting level -> row in the drawn window
    used: list = field(default_factory=list)


def _row(lane: _Lane, depth: int) -> int:
    """The row of ``depth`` in ``lane`` (the nearest level above when it has no slice in the window)."""
    if depth in lane.rows:
        return lane.rows[depth]
    i = bisect.bisect_right(lane.used, depth) - 1
    return lane.rows[lane.used[i]] if i >= 0 else 0


def _hue(name: str) -> int:
    # Kernels carry their op's name without the namespace: the same color for both.
    key = name.split("::", 1)[1] if name.startswith("aten::") else name
    return zlib.crc32(key.encode()) % 360


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.4g} ms"
    return f"{us:.3g} us"


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


@dataclass
class _Meta:
    """The names and sort indices the trace's metadata (``M``) events give processes and threads."""
    proc_names: dict = field(default_factory=dict)
    proc_sort: dict = field(default_factory=dict)
    thread_names: dict = field(default_factory=dict)     # (pid, tid) -> name
    thread_sort: dict = field(default_factory=dict)


@dataclass
class _Frame:
    """The drawn window: trace time from ``start`` to ``end`` (microseconds) across the page."""
    origin: float           # the trace's first event: times on the page count from it
    start: float
    end: float
    width: int
    plot_w: int = field(init=False)     # the slices' part of the width, right of the lane names
    scale: float = field(init=False)    # pixels per microsecond

    def __post_init__(self) -> None:
        self.plot_w = max(self.width - _LABEL_W - 16, 100)
        self.scale = self.plot_w / (self.end - self.start)

    def x(self, ts: float) -> float:
        """The page x of trace time ``ts``."""
        return _LABEL_W + (ts - self.start) * self.scale


def render_html(events: Sequence[dict], *, title: str = "trace", window_ms: Optional[tuple] = None,
                step: Optional[int] = None, width: int = 1600, flow_cats: Optional[set] = None) -> str:
    """The page of the trace ``events``.

    Args:
        events: the trace's events (:func:`load_trace`).
        title: shown in the heading (e.g. the file's name).
        window_ms: ``(start, end)`` in milliseconds from the trace's first event: draw only that.
        step: draw only the span of the slice ``ProfilerStep#<step>`` (PyTorch's profiler).
        width: the page's drawing width in pixels.
        flow_cats: draw only flows of these categories (default: all).

    Raises:
        TraceError: ``step`` names no slice of the trace.
    """
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    meta = _metadata(events)
    lanes, flows, counts = _collect(timed, meta)
    frame, label = _window(timed, lanes, width, window_ms, step)
    bound = _nest(lanes, flows)
    table, body, labels, hidden, height = _draw_lanes(lanes, meta, frame)
    arrows = _draw_flows(flows, bound, lanes, frame, flow_cats)
    svg = _svg(frame, height, _draw_axis(frame, height), body, labels, arrows)
    summary = _summary(label, frame, lanes, len(table), hidden, len(arrows), flows, counts)
    return _page(title, summary, svg, table)


def _metadata(events: Sequence[dict]) -> _Meta:
    """The process and thread names and sort indices of ``events``."""
    meta = _Meta()
    for e in events:
        if e.get("ph") != "M":
            continue
        args = e.get("args") or {}
        name = e.get("name")
        if name == "process_name":
            meta.proc_names[e.get("pid")] = str(args.get("name", ""))
        elif name == "process_sort_index":
            meta.proc_sort[e.get("pid")] = args.get("sort_index", 0)
        elif name == "thread_name":
            meta.thread_names[(e.get("pid"), e.get("tid"))] = str(args.get("name", ""))
        elif name == "thread_sort_index":
            meta.thread_sort[(e.get("pid"), e.get("tid"))] = args.get("sort_index", 0)
    return meta


def _collect(timed: Sequence[dict], meta: _Meta) -> tuple:
    """The lanes with their slices, the flows by (category, id) and the counts of events not drawn."""
    lanes: dict = {}

    def lane(pid: Any, tid: Any) -> _Lane:
        key = (pid, tid)
        if key not in lanes:
            name = meta.thread_names.get(key) or (f"thread {tid}" if tid is not None else "")
            sort = meta.thread_sort.get(key, tid if isinstance(tid, (int, float)) else 0)
            lanes[key] = _Lane(pid, tid, name, sort)
        return lanes[key]

    counts = {"instant": 0, "counter": 0, "other": 0}
    open_b: dict = {}
    flows: dict = {}            # (cat, id) -> {"s": event, "f": event}
    for e in timed:
        ph = e.get("ph")
        if ph == "X":
            lane(e.get("pid"), e.get("tid")).slices.append(
                _Slice(str(e.get("name", "")), float(e["ts"]), float(e.get("dur", 0) or 0), str(e.get("cat", "")),
                       e.get("args")))
        elif ph == "B":
            open_b.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif ph == "E":
            stack = open_b.get((e.get("pid"), e.get("tid")))
            if stack:
                b = stack.pop()
                lane(b.get("pid"), b.get("tid")).slices.append(
                    _Slice(str(b.get("name", "")), float(b["ts"]), float(e["ts"]) - float(b["ts"]),
                           str(b.get("cat", "")), b.get("args")))
        elif ph in ("s", "f"):
            flows.setdefault((e.get("cat"), e.get("id")), {})[ph] = e
        elif ph in ("i", "I", "n"):
            counts["instant"] += 1
        elif ph == "C":
            counts["counter"] += 1
        else:
            counts["other"] += 1
    return lanes, flows, counts


def _window(timed: Sequence[dict], lanes: dict, width: int, window_ms: Optional[tuple],
            step: Optional[int]) -> tuple:
    """The frame to draw (the whole trace, ``step``'s slice or ``window_ms``) and its name."""
    origin = min((e["ts"] for e in timed), default=0.0)
    start, end = origin, max((e["ts"] + float(e.get("dur", 0) or 0) for e in timed), default=origin + 1)
    label = "the whole trace"
    if step is not None:
        name = f"ProfilerStep#{step}"
        found = [s for ln in lanes.values() for s in ln.slices if s.name == name]
        if not found:
            steps = sorted({s.name for ln in lanes.values() for s in ln.slices if s.name.startswith("ProfilerStep#")})
            raise TraceError(f"no slice named {name} in the trace" + (f" (it has {', '.join(steps)})" if steps else ""))
        s0 = min(found, key=lambda s: s.ts)
        start, end = s0.ts, s0.ts + s0.dur
        label = f"{name}"
    if window_ms is not None:
        start, end = origin + window_ms[0] * 1e3, origin + window_ms[1] * 1e3
        label = "window"
    if end <= start:
        end = start + 1.0
    return _Frame(origin, start, end, width), label


def _nest(lanes: dict, flows: dict) -> dict:
    """Nest each lane's slices (their ``depth``); the slice each flow end binds to, by (flow, ``s``/``f``)."""
    ends: dict = {}
    for key, fl in flows.items():
        for ph, e in fl.items():
            ends.setdefault((e.get("pid"), e.get("tid")), []).append((float(e["ts"]), key, ph, e.get("bp")))
    bound: dict = {}
    for key, ln in lanes.items():
        _sweep(key, ln, sorted(ends.get(key, []), key=lambda p: p[0]), bound)
    return bound


def _sweep(key: tuple, ln: _Lane, points: list, bound: dict) -> None:
    """Nest the slices of one lane and bind the flow ends on it to the deepest slice around each."""
    ln.slices.sort(key=lambda s: (s.ts, -s.dur))
    stack: list = []
    pi = 0
    for s in ln.slices + [None]:
        at = s.ts if s is not None else float("inf")
        while pi < len(points) and points[pi][0] < at:    # a slice starting at a point encloses it
            ts = points[pi][0]
            if stack and stack[-1].ts + stack[-1].dur < ts:
                stack = [o for o in stack if o.ts + o.dur >= ts]
            if stack:
                bound[(points[pi][1], points[pi][2])] = (key, stack[-1])
            pi += 1
        if s is None:
            break
        if stack and stack[-1].ts + stack[-1].dur <= s.ts:
            # Drop every slice that has ended, not only the innermost: profilers' slices do not
            # always nest exactly (a caller that ends a little before its callee).
            stack = [o for o in stack if o.ts + o.dur > s.ts]
        s.depth = min(stack[-1].depth + 1 if stack else 0, _MAX_DEPTH)
        stack.append(s)
    # Points that no slice encloses bind to the next slice that starts after them.
    starts = [s.ts for s in ln.slices]
    for ts, fkey, ph, _bp in points:
        if (fkey, ph) not in bound:
            i = bisect.bisect_left(starts, ts)
            if i < len(ln.slices):
                bound[(fkey, ph)] = (key, ln.slices[i])


def _processes(lanes: dict, meta: _Meta) -> list:
    """``(heading, lanes)`` of each process with slices, processes and lanes in their sort order."""
    procs: dict = {}
    for ln in lanes.values():
        if ln.slices:
            procs.setdefault(ln.pid, []).append(ln)
    order = sorted(procs, key=lambda p: (
        _sort_key(meta.proc_sort.get(p, p if isinstance(p, (int, float)) else 1 << 62)), _sort_key(p)))
    out = []
    for pid in order:
        pname = meta.proc_names.get(pid, "")
        heading = f"{pname} (pid {pid})" if pname and pname != str(pid) else f"process {pid}"
        out.append((heading, sorted(procs[pid], key=lambda ln: (_sort_key(ln.sort), _sort_key(ln.tid)))))
    return out


def _draw_lanes(lanes: dict, meta: _Meta, frame: _Frame) -> tuple:
    """The processes and their lanes of slices: (slices' table, drawing, labels, slices too narrow, height)."""
    # Sets what the arrows are drawn from: each lane's y and rows, each drawn slice's index.
    table: list = []
    body: list = []
    labels: list = []
    hidden = 0
    y = _AXIS_H + 4
    for heading, proc_lanes in _processes(lanes, meta):
        labels.append(f'<text class="proc" x="6" y="{_f(y + 14)}">{html.escape(heading)}</text>')
        body.append(f'<line class="procline" x1="0" x2="{frame.width}" y1="{_f(y)}" y2="{_f(y)}"/>')
        y += _PROC_H
        for ln in proc_lanes:
            ln.y = y
            in_window = [s for s in ln.slices if s.ts < frame.end and s.ts + s.dur > frame.start]
            visible = [s for s in in_window if min(frame.x(s.ts + s.dur), _LABEL_W + frame.plot_w)
                       - max(frame.x(s.ts), _LABEL_W) >= _MIN_PX]
            hidden += len(in_window) - len(visible)
            # Rows of the nesting levels drawn in the window, without the empty ones between.
            ln.used = sorted({s.depth for s in visible})
            ln.rows = {d: r for r, d in enumerate(ln.used)}
            depth = max(len(ln.used), 1)
            labels.append(f'<text class="lane" x="16" y="{_f(y + 12)}">{html.escape(ln.name)}</text>')
            body.append(f'<rect class="laneband" x="{_LABEL_W}" y="{_f(y)}" width="{frame.plot_w}" '
                        f'height="{depth * _ROW_H}"/>')
            for s in visible:
                s.index = len(table)
                table.append([s.name, round((s.ts - frame.origin) / 1e3, 6), round(s.dur, 3),
                              f"{heading} / {ln.name}", s.cat, s.args if isinstance(s.args, dict) else {}])
                body.append(_draw_slice(s, y + ln.rows[s.depth] * _ROW_H, frame))
            y += depth * _ROW_H + _LANE_GAP
    return table, body, labels, hidden, y + 8


def _draw_slice(s: _Slice, sy: float, frame: _Frame) -> str:
    """One slice at row top ``sy``: its box, cut to the window, and its name if it fits."""
    x0 = max(frame.x(s.ts), _LABEL_W)
    x1 = min(frame.x(s.ts + s.dur), _LABEL_W + frame.plot_w)
    w = x1 - x0
    out = (f'<g class="sl" data-i="{s.index}"><rect x="{_f(x0)}" y="{_f(sy + 0.5)}" width="{_f(w)}" '
           f'height="{_ROW_H - 1}" fill="hsl({_hue(s.name)},52%,72%)"/>')
    chars = int((w - 4) / 6.2)
    if chars >= 3:
        text = s.name if len(s.name) <= chars else s.name[:chars - 1] + "\u2026"
        out += f'<text x="{_f(x0 + 2)}" y="{_f(sy + 11)}">{html.escape(text)}</text>'
    return out + "</g>"


def _draw_flows(flows: dict, bound: dict, lanes: dict, frame: _Frame, flow_cats: Optional[set]) -> list:
    """The flow arrows whose ends are both in the window and bound to drawn lanes."""
    arrows: list = []
    for key, fl in flows.items():
        if flow_cats is not None and key[0] not in flow_cats:
            continue
        if "s" not in fl or "f" not in fl:
            continue
        src, dst = bound.get((key, "s")), bound.get((key, "f"))
        if not src or not dst:
            continue
        ts_s, ts_f = float(fl["s"]["ts"]), float(fl["f"]["ts"])
        if not (frame.start <= ts_s <= frame.end and frame.start <= ts_f <= frame.end):
            continue
        (skey, ss), (dkey, ds) = src, dst
        x1, x2 = frame.x(ts_s), frame.x(ts_f)
        y1 = lanes[skey].y + _row(lanes[skey], ss.depth) * _ROW_H + _ROW_H - 1
        y2 = lanes[dkey].y + _row(lanes[dkey], ds.depth) * _ROW_H + 0.5
        if y2 < y1:     # pointing up: leave from the top of the source, arrive at the bottom
            y1 -= _ROW_H - 1
            y2 += _ROW_H - 1
        bend = max(abs(y2 - y1) * 0.4, 8)
        sign = 1 if y2 >= y1 else -1
        cat = html.escape(str(key[0]))
        arrows.append(f'<path class="flow" data-cat="{cat}" data-a="{ss.index}" data-b="{ds.index}" '
                      f'd="M{_f(x1)},{_f(y1)} C{_f(x1)},{_f(y1 + sign * bend)} {_f(x2)},{_f(y2 - sign * bend)} '
                      f'{_f(x2)},{_f(y2)}"/>')
    return arrows


def _draw_axis(frame: _Frame, height: float) -> str:
    """The time axis: round ticks in milliseconds from the trace's first event, lines down the page."""
    ticks: list = []
    origin, start, end = frame.origin, frame.start, frame.end
    step_ms = _nice_step((end - start) / 1e3, max(frame.plot_w // 110, 2))
    first = (int(((start - origin) / 1e3) / step_ms) + 1) * step_ms
    t = first - step_ms
    while t <= (end - origin) / 1e3 + 1e-9:
        if t >= (start - origin) / 1e3 - 1e-9:
            px = frame.x(origin + t * 1e3)
            xx = _f(px)
            anchor = "end" if px > frame.width - 40 else "middle"
            ticks.append(f'<line class="tickline" x1="{xx}" x2="{xx}" y1="{_AXIS_H - 6}" y2="{height}"/>'
                         f'<text class="tick" x="{xx}" y="{_AXIS_H - 9}" text-anchor="{anchor}">{t:.6g} ms</text>')
        t += step_ms
    return "".join(ticks)


def _svg(frame: _Frame, height: float, axis: str, body: list, labels: list, arrows: list) -> str:
    """The drawing: the axis and lanes, the labels' column over them, then the flow arrows on top."""
    return (f'<svg class="trace" width="{frame.width}" height="{_f(height)}">'
            + axis + "".join(body)
            + f'<rect class="labelbg" x="0" y="0" width="{_LABEL_W - 4}" height="{_f(height)}"/>'
            + "".join(labels)
            + '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
              'orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" class="arrowhead"/></marker></defs>'
            + '<g class="flows">' + "".join(arrows) + "</g></svg>")


def _summary(label: str, frame: _Frame, lanes: dict, drawn: int, hidden: int, n_flows: int, flows: dict,
             counts: dict) -> str:
    """The line under the heading: the window, and what is drawn and what is not (HTML)."""
    origin, start, end = frame.origin, frame.start, frame.end
    cats = sorted({str(k[0]) for k in flows})
    notes = [f"{sum(len(ln.slices) for ln in lanes.values()):,} slices in the trace, "
             f"{drawn:,} drawn in this window"]
    if hidden:
        notes.append(f"{hidden:,} under half a pixel wide left out (narrow the window to see them)")
    notes.append(f"{n_flows:,} flow arrows" + (f" ({', '.join(html.escape(c) for c in cats)})" if cats else ""))
    if counts["instant"] or counts["counter"]:
        notes.append(f"{counts['instant']:,} instant and {counts['counter']:,} counter events not drawn")
    window_text = (f"{label}: {(start - origin) / 1e3:.6g} ms to {(end - origin) / 1e3:.6g} ms from the "
                   f"trace's first event ({_fmt_us(end - start)})")
    return f"{html.escape(window_text)}. " + "; ".join(notes) + ". "


def _page(title: str, summary: str, svg: str, table: list) -> str:
    """The page around the drawing: heading, summary, the hover box, the slices' data and the script."""
    payload = json.dumps({"slices": table}, separators=(",", ":"), default=str).replace("</", "<\\/")
    title_text = html.escape(title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title_text}: timeline</title><style>{_STYLE}</style></head><body>"
        f"<h1>Trace timeline: {title_text}</h1>"
        f'<p class="muted">{summary}'
        "Hover a slice for its details; click it to highlight its flows.</p>"
        + svg + '<div id="info"></div>'
        f'<script type="application/json" id="traceviz-data">{payload}</script>'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


_STYLE = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:14px 18px;color:#1d2329;background:#fff}
h1{font-size:18px;margin:0 0 4px}.muted{color:#5f6b76;margin:0 0 8px}
svg.trace text{font-size:11px;fill:#1d2329;pointer-events:none}
.tick{fill:#5f6b76!important}.tickline{stroke:#e4e8ec}.procline{stroke:#9aa5ae}
.proc{font-weight:600;font-size:12px!important}.lane{fill:#3b444c!important}
.laneband{fill:#f6f8fa}.labelbg{fill:#fff}
.sl rect{stroke:rgba(0,0,0,.25);stroke-width:.5}.sl:hover rect,.sl.sel rect{stroke:#000;stroke-width:1.5}
.flow{fill:none;stroke:#c2410c;stroke-width:1;opacity:.75;marker-end:url(#arrow)}
.flow[data-cat="fwdbwd"]{stroke:#6d28d9;stroke-width:.7;opacity:.3}
.flow.hl{stroke-width:2.5;opacity:1}.arrowhead{fill:#c2410c}
#info{position:fixed;right:12px;top:12px;width:380px;max-height:calc(100vh - 40px);overflow:auto;background:#fffffff2;border:1px solid #b9c2ca;border-radius:6px;padding:8px 12px;font-size:12px;box-shadow:0 2px 10px rgba(0,0,0,.12);display:none}
#info .k{color:#5f6b76}#info td{vertical-align:top;padding:0 6px 0 0;word-break:break-all}
"""

_SCRIPT = r"""
(function(){
var D=JSON.parse(document.getElementById('traceviz-data').textContent),info=document.getElementById('info'),sel=null;
function esc(s){return String(s).replace(/[&<>"]/g,function(c){return{'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
function dur(us){return us>=1000?(us/1000).toFixed(3)+' ms':us.toFixed(3)+' us';}
function show(i){var s=D.slices[i],rows='';
 Object.keys(s[5]).slice(0,14).forEach(function(k){var v=JSON.stringify(s[5][k]);if(v.length>160)v=v.slice(0,157)+'...';rows+='<tr><td class="k">'+esc(k)+'</td><td>'+esc(v)+'</td></tr>';});
 info.innerHTML='<b>'+esc(s[0])+'</b><br><span class="k">'+esc(s[3])+(s[4]?' &middot; '+esc(s[4]):'')+'</span><br>'+
  '<span class="k">start</span> '+s[1].toFixed(3)+' ms <span class="k">duration</span> '+dur(s[2])+(rows?'<table>'+rows+'</table>':'');
 info.style.display='block';}
function flows(i,on){document.querySelectorAll('.flow[data-a="'+i+'"],.flow[data-b="'+i+'"]').forEach(function(p){p.classList.toggle('hl',on);});}
document.addEventListener('mouseover',function(ev){var g=ev.target.closest&&ev.target.closest('.sl');if(g&&!sel)show(+g.getAttribute('data-i'));});
document.addEventListener('click',function(ev){var g=ev.target.closest&&ev.target.closest('.sl');if(!g)return;
 if(sel){sel.classList.remove('sel');flows(sel.getAttribute('data-i'),false);if(sel===g){sel=null;return;}}
 sel=g;g.classList.add('sel');flows(g.getAttribute('data-i'),true);show(+g.getAttribute('data-i'));});
var m=/^#slice=(\d+)$/.exec(location.hash);if(m){var g=document.querySelector('.sl[data-i="'+m[1]+'"]');if(g){sel=g;g.classList.add('sel');flows(m[1],true);show(+m[1]);}}
})();
"""
