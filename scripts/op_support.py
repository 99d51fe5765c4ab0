#!/usr/bin/env python
"""Run PyTorch's OpInfo and ModuleInfo conformance on neuron and write the support table.

Every OpInfo of ``op_db`` runs for each dtype of float32, float64, bfloat16,
float16, int64, bool and complex64 it supports, checking forward, backward,
in-place, out= and a second device against the CPU; every ModuleInfo of
``module_db`` runs for float32 and float64 (.to, forward, backward,
state_dict). The checks are those of tests/conformance (opcheck.py,
modcheck.py); results are compared with tests/conformance/expected_failures.py.

Work runs in child processes, so an op that crashes or hangs is recorded as
such and the run goes on. Writes docs/op_support.md and docs/op_support.json
and prints the headline figures. Exits 1 if a result disagrees with the
expected-failure list.

Usage::

    nice -n 19 python scripts/op_support.py            # everything (about 20-40 min on 2 cores)
    python scripts/op_support.py --quick               # the quick slice of the default test suite
    python scripts/op_support.py --ops add,nn.functional.conv2d --dtypes float32 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFORMANCE = os.path.join(ROOT, "tests", "conformance")
sys.path.insert(0, CONFORMANCE)

OP_DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "bool", "complex64")
MODULE_DTYPES = ("float32", "float64")
OP_ASPECTS = ("forward", "backward", "gradgrad", "fwad", "inplace", "out", "device1")
MODULE_ASPECTS = ("to", "forward", "backward", "state_dict", "to_identity")
HEADLINE_OP_ASPECTS = ("forward", "backward")
HEADLINE_MODULE_ASPECTS = ("to", "forward", "backward", "state_dict")


# ---- worker (child process) ----------------------------------------------------------------------

def worker(args):
    """Run tasks read from a JSON file; append one JSON line per task start and result."""
    import torch  # noqa: F401  (autoloads torchneuron)
    import modcheck
    import opcheck
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    torch.set_num_threads(1)
    ops = {op.full_name: op for op in op_db}
    modules = {m.name: m for m in module_db}
    with open(args.tasks) as f:
        tasks = json.load(f)
    with open(args.results, "a") as out:
        for kind, name, dtype in tasks:
            out.write(json.dumps({"start": [kind, name, dtype]}) + "\n")
            out.flush()
            dt = getattr(torch, dtype)
            if kind == "op":
                r = opcheck.check_op(ops[name], dt, max_samples=args.max_samples, inputs=args.inputs)
            else:
                r = modcheck.check_module(modules[name], dt, max_inputs=args.max_inputs)
            aspects = {a: {"status": x.status, "samples": x.samples, "reason": x.reason, "detail": x.detail,
                           "note": x.note}
                       for a, x in r.aspects.items()}
            out.write(json.dumps({"done": [kind, name, dtype], "aspects": aspects,
                                  "seconds": round(r.seconds, 3)}) + "\n")
            out.flush()


# ---- parent --------------------------------------------------------------------------------------

def build_tasks(args):
    import torch
    import selection
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    full = not args.quick
    ops = selection.selected_ops(op_db, full=full)
    modules = selection.selected_modules(module_db, full=full)
    if args.ops:
        wanted = set(args.ops.split(","))
        ops = [op for op in op_db if op.full_name in wanted or op.name in wanted]
        modules = [m for m in module_db if m.name in wanted]
    dtypes = args.dtypes.split(",") if args.dtypes else None
    tasks, supported = [], {}
    for op in ops:
        sup = op.supported_dtypes("cpu")
        names = [d for d in OP_DTYPES if getattr(torch, d) in sup and (not dtypes or d in dtypes)]
        supported[op.full_name] = names
        tasks += [("op", op.full_name, d) for d in names]
    mod_supported = {}
    if not args.no_modules:
        for m in modules:
            sup = m.supported_dtypes("cpu")
            names = [d for d in MODULE_DTYPES if getattr(torch, d) in sup and (not dtypes or d in dtypes)]
            mod_supported[m.name] = names
            tasks += [("module", m.name, d) for d in names]
    return tasks, supported, mod_supported


class Worker:
    def __init__(self, tasks, args, tmpdir, index):
        self.pending = [tuple(t) for t in tasks]
        self.args = args
        self.tmpdir = tmpdir
        self.index = index
        self.results = {}
        self.proc = None
        self.offset = 0
        self.current = None
        self.started_at = None
        self.restarts = 0

    def launch(self):
        path = os.path.join(self.tmpdir, f"tasks{self.index}_{self.restarts}.json")
        with open(path, "w") as f:
            json.dump(self.pending, f)
        self.results_path = os.path.join(self.tmpdir, f"results{self.index}_{self.restarts}.jsonl")
        self.stderr_path = os.path.join(self.tmpdir, f"stderr{self.index}_{self.restarts}.txt")
        open(self.results_path, "w").close()
        self.offset = 0
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--tasks", path,
               "--results", self.results_path, "--max-samples", str(self.args.max_samples),
               "--max-inputs", str(self.args.max_inputs), "--inputs", self.args.inputs]
        self.stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.stderr, cwd=ROOT)
        self.current, self.started_at = None, time.monotonic()

    def poll(self):
        """Read new results; return the number of tasks finished since the last call."""
        finished = 0
        with open(self.results_path) as f:
            f.seek(self.offset)
            while True:
                line = f.readline()
                if not line or not line.endswith("\n"):
                    break
                self.offset = f.tell()
                msg = json.loads(line)
                if "start" in msg:
                    self.current, self.started_at = tuple(msg["start"]), time.monotonic()
                else:
                    key = tuple(msg["done"])
                    self.results[key] = msg
                    self.pending.remove(key)
                    self.current = None
                    finished += 1
        return finished

    def check(self):
        """Handle a finished, crashed or hung child; return the tasks it finished or lost."""
        rc = self.proc.poll()
        hung = (rc is None and self.current is not None
                and time.monotonic() - self.started_at > self.args.timeout)
        if rc is None and not hung:
            return 0
        if hung:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finished = self.poll()
        self.stderr.close()
        if not self.pending:
            return finished
        lost = self.current or tuple(self.pending[0])
        with open(self.stderr_path) as f:
            tail = f.read()[-3000:]
        if hung:
            reason = f"timed out after {self.args.timeout:.0f} s (hung or far too slow)"
        else:
            sig = -self.proc.returncode if self.proc.returncode < 0 else None
            reason = (f"process crashed: {signal.Signals(sig).name}" if sig
                      else f"process exited with code {self.proc.returncode}")
        aspects = OP_ASPECTS if lost[0] == "op" else MODULE_ASPECTS
        self.results[lost] = {"done": list(lost), "seconds": None, "aspects": {
            a: {"status": "fail", "samples": 0, "reason": reason, "detail": tail} for a in aspects}}
        self.pending.remove(lost)
        self.restarts += 1
        if self.pending:
            self.launch()
        return finished + 1


def run_all(tasks, args):
    tmpdir = tempfile.mkdtemp(prefix="op_support_")
    jobs = max(1, min(args.jobs, len(tasks)))
    workers = [Worker(tasks[i::jobs], args, tmpdir, i) for i in range(jobs)]
    for w in workers:
        w.launch()
    done, total, t0, last_print = 0, len(tasks), time.monotonic(), 0.0
    while any(w.pending for w in workers):
        time.sleep(0.5)
        for w in workers:
            if not w.pending:
                continue
            done += w.poll()
            if w.pending:
                done += w.check()
        now = time.monotonic()
        if now - last_print > args.progress or done == total:
            last_print = now
            elapsed = now - t0
            eta = elapsed / done * (total - done) if done else float("nan")
            current = ", ".join(f"{w.current[1]}/{w.current[2]}" for w in workers if w.current)
            print(f"[{done}/{total}] {elapsed / 60:5.1f} min elapsed, ~{eta / 60:4.1f} min left  {current}",
                  file=sys.stderr, flush=True)
    for w in workers:
        if w.proc and w.proc.poll() is None:
            w.proc.wait()
    results = {}
    for w in workers:
        results.update(w.results)
    shutil.rmtree(tmpdir, ignore_errors=True)
    return results, time.monotonic() - t0


# ---- reporting -----------------------------------------------------------------------------------

def classify(results):
    """Compare with the expected-failure list: returns (unexpected failures, unexpected passes)."""
    from expected_failures import expected_module_failure, expected_op_failure, judge
    bad_fail, bad_pass = [], []
    for (kind, name, dtype), r in sorted(results.items()):
        expect = expected_op_failure if kind == "op" else expected_module_failure
        for aspect, a in r["aspects"].items():
            entry = expect(name, dtype, aspect)
            a["expected"] = entry.reason if entry is not None and a["status"] == "fail" else None
            verdict = judge(entry, a["status"])
            if verdict == "unexpected failure":
                bad_fail.append((kind, name, dtype, aspect, a["reason"]))
            elif verdict == "unexpected pass":
                bad_pass.append((kind, name, dtype, aspect, entry.reason))
    return bad_fail, bad_pass


def headline(results, supported, kind, dtypes, aspects, all_aspects):
    figures = {}
    for d in dtypes:
        # ops the CPU itself cannot run on any sample (CUDA-only jiterator ops) compare nothing: left out
        names = [n for n, ds in supported.items() if d in ds and (kind, n, d) in results
                 and results[(kind, n, d)]["aspects"].get("forward", {}).get("status") != "n/a"]
        key_ok = [n for n in names if (kind, n, d) in results and all(
            results[(kind, n, d)]["aspects"].get(a, {}).get("status", "n/a") != "fail" for a in aspects)]
        all_ok = [n for n in names if (kind, n, d) in results and all(
            results[(kind, n, d)]["aspects"].get(a, {}).get("status", "n/a") != "fail" for a in all_aspects)]
        if names:
            figures[d] = {"supported": len(names), "pass": len(key_ok),
                          "percent": round(100.0 * len(key_ok) / len(names), 2),
                          "pass_all_aspects": len(all_ok),
                          "percent_all_aspects": round(100.0 * len(all_ok) / len(names), 2)}
    return figures


def cell(r, aspects):
    if r is None:
        return "–"
    failing = [a for a in aspects if r["aspects"].get(a, {}).get("status") == "fail"]
    if not failing:
        return "✓"
    return "✗ " + ", ".join(failing)


def write_docs(results, supported, mod_supported, figures, mod_figures, meta, bad_fail, bad_pass, outdir):
    os.makedirs(outdir, exist_ok=True)
    ops_json = defaultdict(dict)
    mods_json = defaultdict(dict)
    for (kind, name, dtype), r in sorted(results.items()):
        aspects = {}
        for a, x in r["aspects"].items():
            if x["status"] == "n/a" and not x.get("reason"):
                continue  # the op has no such variant, or the dtype no gradient
            aspects[a] = {"status": x["status"], "samples": x.get("samples", 0)}
            for k in ("reason", "note", "expected"):
                if x.get(k):
                    aspects[a][k] = x[k]
        (ops_json if kind == "op" else mods_json)[name][dtype] = {"seconds": r["seconds"], "aspects": aspects}

    def one_line_each(table):
        rows = [f"  {json.dumps(n)}: {json.dumps(v, separators=(',', ':'), ensure_ascii=False)}"
                for n, v in table.items()]
        return "{\n" + ",\n".join(rows) + "\n }"
    head = {"meta": meta, "headline": {"ops": figures, "modules": mod_figures},
            "note": "per op and dtype: the checks that apply, with status pass/fail/n/a, samples compared, "
                    "the first failure's reason, a note when a match needed the looser tolerance, and the "
                    "expected_failures.py reason for a listed failure; dtypes absent are not supported by "
                    "PyTorch's CPU kernels either",
            "unexpected_failures": [list(x) for x in bad_fail],
            "unexpected_passes": [list(x) for x in bad_pass]}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    text += ',\n "ops": ' + one_line_each(ops_json) + ',\n "modules": ' + one_line_each(mods_json) + "\n}\n"
    json.loads(text)  # stays valid JSON
    with open(os.path.join(outdir, "op_support.json"), "w") as f:
        f.write(text)

    L = []
    L.append("# Op support on neuron\n")
    L.append("PyTorch's own OpInfo (`op_db`) and ModuleInfo (`module_db`) test inputs, run on the emulated "
             "NeuronCore and compared with the CPU. Generated by `nice -n 19 python scripts/op_support.py` "
             f"on {meta['date']} with torch {meta['torch']} ({meta['minutes']:.1f} min, up to "
             f"{meta['max_samples']} samples per op and dtype, {meta['max_inputs']} inputs per module). "
             "Do not edit by hand; the machine-readable twin is `op_support.json`.\n")
    L.append("Checks per op and dtype: **forward** (every sample's results: values, dtype, shape, device, and "
             "errors raised), **backward** (gradients of every differentiable input for a random cotangent, "
             "where PyTorch supports autograd for the dtype), **gradgrad** (second-order gradients, cotangents "
             "included, float32, first 8 samples), **fwad** (forward-mode AD tangents, float32, first 8 samples), "
             "**inplace** (the `op_` variant: result and mutated self), **out** (`out=` with empty "
             "to-be-resized, correctly sized and noncontiguous tensors, by turns), **device1** (the first sample "
             "on `neuron:1` while `neuron:0` is current; float32 only). Samples are created on neuron and "
             "copied to the CPU with their exact strides and storage offsets; the first three also run as "
             "noncontiguous twins. Freed device blocks are poisoned before each sample, so reads of "
             "uninitialized device memory show. The headline counts forward and backward; the per-op table "
             "shows every check.\n")
    L.append("Whole models, one op sequence each: tiny transformers models (decoders, mixture-of-experts, encoders, "
             "encoder-decoders, vision, audio), one training step on neuron against the CPU, eager and compiled, "
             "in [model_suite.md](model_suite.md) (`benchmarks/model_suite.py`).\n")
    if meta.get("quick") or meta.get("ops_filter") or meta.get("dtypes_filter"):
        L.append(f"**Partial run** (quick={meta.get('quick')}, ops={meta.get('ops_filter')}, "
                 f"dtypes={meta.get('dtypes_filter')}).\n")
    L.append("## Headline\n")
    not_comparable = sorted({n for (k, n, d), r in results.items()
                             if k == "op" and r["aspects"].get("forward", {}).get("status") == "n/a"})
    if not_comparable:
        L.append("Left out of the counts, as every sample raises on the CPU too (nothing to compare): "
                 + ", ".join(f"`{n}`" for n in not_comparable) + ".\n")
    L.append("| dtype | ops | pass forward + backward | % | pass every check | % |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for d, f in figures.items():
        L.append(f"| {d} | {f['supported']} | {f['pass']} | {f['percent']:.1f} | {f['pass_all_aspects']} | "
                 f"{f['percent_all_aspects']:.1f} |")
    L.append("")
    if mod_figures:
        L.append("| module dtype | modules | pass .to, forward, backward, state_dict | % | "
                 "also keep Parameter identity on .to | % |")
        L.append("|---|---:|---:|---:|---:|---:|")
        for d, f in mod_figures.items():
            L.append(f"| {d} | {f['supported']} | {f['pass']} | {f['percent']:.1f} | {f['pass_all_aspects']} | "
                     f"{f['percent_all_aspects']:.1f} |")
        L.append("")
    if bad_fail or bad_pass:
        L.append("## Disagreements with the expected-failure list\n")
        for kind, name, dtype, aspect, reason in bad_fail:
            L.append(f"- unexpected failure: {kind} `{name}` {dtype} {aspect}: {reason}")
        for kind, name, dtype, aspect, reason in bad_pass:
            L.append(f"- unexpected pass: {kind} `{name}` {dtype} {aspect} (listed: {reason})")
        L.append("")
    # failures grouped by (name, aspect, listed reason, observed message)
    groups = defaultdict(list)
    for (kind, name, dtype), r in sorted(results.items()):
        for aspect, a in r["aspects"].items():
            if a["status"] == "fail":
                groups[(kind, name, aspect, a.get("expected") or "NOT LISTED", a["reason"])].append(dtype)
    L.append("## Failures\n")
    if not groups:
        L.append("None.\n")
    else:
        L.append("Each row: what fails, the reason given in `tests/conformance/expected_failures.py`, and the "
                 "first mismatch observed.\n")
        L.append("| kind | name | aspect | dtypes | reason (expected_failures.py) | observed |")
        L.append("|---|---|---|---|---|---|")

        def esc(text, n):
            text = text.replace("|", "\\|").replace("\n", " ")
            return text if len(text) <= n else text[:n] + "…"
        merged = defaultdict(list)
        for (kind, name, aspect, listed, observed), ds in groups.items():
            merged[(kind, name, aspect, listed, observed[:120])] += ds
        for (kind, name, aspect, listed, observed), ds in sorted(merged.items()):
            ds = [d for d in (OP_DTYPES if kind == "op" else MODULE_DTYPES) if d in ds]
            L.append(f"| {kind} | `{name}` | {aspect} | {', '.join(ds)} | {esc(listed, 400)} | "
                     f"{esc(observed, 160)} |")
        L.append("")
    notes = defaultdict(list)
    for (kind, name, dtype), r in sorted(results.items()):
        for aspect, a in r["aspects"].items():
            if a.get("note") and a["status"] == "pass":
                notes[(kind, name, aspect)].append((dtype, a["note"]))
    if notes:
        L.append("## Passing with a note: numerics of a different code path\n")
        L.append("These match the CPU only within the tolerance PyTorch's own `test_compare_cpu` allows an "
                 "accelerator (atol = rtol = 1e-3), not to `assert_close`'s defaults for the dtype: neuron ran "
                 "a different implementation than the CPU (a decomposition instead of the CPU's fused kernel, "
                 "a device-dependent algorithm choice), or autograd accumulated gradients in another order "
                 "(the engine runs a device's backward on its own thread).\n")
        L.append("| kind | name | aspect | dtypes | first note |")
        L.append("|---|---|---|---|---|")
        for (kind, name, aspect), items in sorted(notes.items()):
            note = items[0][1].split(" [sample")[0].replace("|", "\\|")
            L.append(f"| {kind} | `{name}` | {aspect} | {', '.join(d for d, _ in items)} | {note} |")
        L.append("")
    L.append("## Ops\n")
    L.append("✓: every check passes; ✗: the listed checks fail (see Failures); –: dtype not supported by "
             "PyTorch on the CPU either.\n")
    L.append("| op | " + " | ".join(OP_DTYPES) + " |")
    L.append("|---|" + "---|" * len(OP_DTYPES))
    for name, ds in supported.items():
        L.append(f"| `{name}` | " + " | ".join(cell(results.get(("op", name, d)), OP_ASPECTS) for d in OP_DTYPES)
                 + " |")
    L.append("")
    if mod_supported:
        L.append("## Modules\n")
        L.append("| module | " + " | ".join(MODULE_DTYPES) + " |")
        L.append("|---|" + "---|" * len(MODULE_DTYPES))
        for name, ds in mod_supported.items():
            L.append(f"| `{name}` | " + " | ".join(cell(results.get(("module", name, d)), MODULE_ASPECTS)
                                                   for d in MODULE_DTYPES) + " |")
        L.append("")
    with open(os.path.join(outdir, "op_support.md"), "w") as f:
        f.write("\n".join(L))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="only the quick slice of the default test suite")
    p.add_argument("--ops", help="comma-separated OpInfo full names / ModuleInfo names to run")
    p.add_argument("--dtypes", help="comma-separated dtype names (default: all covered)")
    p.add_argument("--no-modules", action="store_true", help="skip module_db")
    p.add_argument("--max-samples", type=int, default=None, help="sample inputs per op and dtype")
    p.add_argument("--max-inputs", type=int, default=None, help="module inputs per module and dtype")
    p.add_argument("--inputs", choices=("sample", "reference"), default=None,
                   help="OpInfo sample_inputs or reference_inputs (default: as the pytest suite)")
    p.add_argument("--jobs", type=int, default=1, help="child processes (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one op and dtype may take")
    p.add_argument("--progress", type=float, default=30, help="seconds between progress lines")
    p.add_argument("--output-dir", default=os.path.join(ROOT, "docs"))
    p.add_argument("--no-write", action="store_true", help="print figures only, write no docs")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tasks", help=argparse.SUPPRESS)
    p.add_argument("--results", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import modcheck
    import opcheck
    if args.max_samples is None:
        args.max_samples = opcheck.DEFAULT_MAX_SAMPLES
    if args.max_inputs is None:
        args.max_inputs = modcheck.DEFAULT_MAX_INPUTS
    if args.inputs is None:
        args.inputs = opcheck.DEFAULT_INPUTS
    if args.worker:
        return worker(args)

    import torch
    tasks, supported, mod_supported = build_tasks(args)
    print(f"{len(tasks)} op/module x dtype runs", file=sys.stderr)
    results, seconds = run_all(tasks, args)
    bad_fail, bad_pass = classify(results)
    figures = headline(results, supported, "op", OP_DTYPES, HEADLINE_OP_ASPECTS, OP_ASPECTS)
    mod_figures = headline(results, mod_supported, "module", MODULE_DTYPES, HEADLINE_MODULE_ASPECTS,
                           MODULE_ASPECTS)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "minutes": round(seconds / 60, 2), "max_samples": args.max_samples,
            "max_inputs": args.max_inputs, "quick": args.quick, "ops_filter": args.ops,
            "dtypes_filter": args.dtypes, "runs": len(tasks)}
    if not args.no_write:
        write_docs(results, supported, mod_supported, figures, mod_figures, meta, bad_fail, bad_pass,
                   args.output_dir)

    print(f"\nOps passing every sample forward + backward ({seconds / 60:.1f} min):")
    for d, f in figures.items():
        print(f"  {d:10s} {f['percent']:6.2f}%  ({f['pass']}/{f['supported']});  every aspect incl. in-place, "
              f"out=, neuron:1: {f['percent_all_aspects']:.2f}%")
    if mod_figures:
        print("Modules passing .to, forward, backward, state_dict:")
        for d, f in mod_figures.items():
            print(f"  {d:10s} {f['percent']:6.2f}%  ({f['pass']}/{f['supported']})")
    for kind, name, dtype, aspect, reason in bad_fail:
        print(f"UNEXPECTED FAILURE {kind} {name} {dtype} {aspect}: {reason}")
    for kind, name, dtype, aspect, reason in bad_pass:
        print(f"UNEXPECTED PASS {kind} {name} {dtype} {aspect} (listed: {reason})")
    if not args.no_write:
        print(f"wrote {os.path.join(args.output_dir, 'op_support.md')} and op_support.json")
    return 1 if bad_fail or bad_pass else 0


if __name__ == "__main__":
    sys.exit(main())
