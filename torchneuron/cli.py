"""Command-line interface: ``python -m torchneuron <command>`` or ``torchneuron <command>``.

Each subcommand is a :class:`Command` in :data:`COMMANDS`: a name, a help line, a
function that adds its arguments to a parser and a function that runs it and
returns the exit code. The package itself is imported only inside the run
functions, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence


@dataclass(frozen=True)
class Command:
    """One CLI subcommand.

    Args:
        name: word typed after ``torchneuron``.
        help: one-line description shown by ``--help``.
        add_arguments: adds the subcommand's options to its parser.
        run: executes the subcommand and returns the process exit code.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _positive_int(text: str) -> int:
    """Parse a command-line value as an integer of at least 1.

    Args:
        text: the raw value.
    """
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``demo`` subcommand.

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument("--steps", type=_positive_int, default=200, help="training steps per run (default: 200)")
    parser.add_argument("--device", default="neuron", help="device under test (default: neuron)")
    parser.add_argument("--compare-device", default="cpu", help="reference device, trained first (default: cpu)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="add a third run with torch.compile on --device (default: on; --no-compile skips it)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights, batches and sampling (default: 0)")


def _run_demo(args: argparse.Namespace) -> int:
    """Run the training demo; exit code 1 when the loss curves do not match.

    Args:
        args: parsed options of the ``demo`` subcommand.
    """
    from torchneuron.demo import run_demo

    result = run_demo(
        steps=args.steps,
        device=args.device,
        compare_device=args.compare_device,
        compile=args.compile,
        seed=args.seed,
    )
    return 0 if result["match"] else 1


def _add_migrate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``migrate`` subcommand."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or directories to rewrite")
    parser.add_argument("--write", action="store_true", help="rewrite the files in place (default: show a diff)")


def _run_migrate(args: argparse.Namespace) -> int:
    """Rewrite CUDA-specific code; see torchneuron.migrate.rewrite."""
    from torchneuron.migrate.rewrite import main as migrate

    return migrate(args.paths, write=args.write)


def _add_script_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``script`` and its arguments (options before the script, or after it, belong to the tool)."""
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("script", help="the Python program to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="its arguments (after `--`, all of them, even ones named like ours)")


def _add_parity_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``parity`` subcommand."""
    parser.add_argument("--rtol", type=float, help="relative tolerance (default 1e-4; 2e-2 with autocast)")
    parser.add_argument("--atol", type=float, help="absolute tolerance (default 1e-5; 1e-3 with autocast)")
    _add_script_arguments(parser)


def _add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``doctor`` subcommand."""
    parser.add_argument("--sanitize", action="store_true",
                        help="run the program under the stream sanitizer and list the synchronization bugs it "
                             "finds (exit code 1 if any)")
    parser.add_argument("--trace", metavar="FILE",
                        help="also run it under torch.profiler, write the Chrome trace (host ops, device lanes) to "
                             "FILE and list the ops by device time")
    _add_script_arguments(parser)


def _run_doctor(args: argparse.Namespace) -> int:
    """Run a program on neuron and report ops, syncs, copies, memory and graph breaks."""
    from torchneuron.migrate.doctor import main as doctor

    return doctor(args.script, args.script_args, json_path=args.json, sanitize_only=args.sanitize,
                  trace_path=args.trace)


def _run_parity(args: argparse.Namespace) -> int:
    """Run a program on the CPU and on neuron and compare its losses."""
    from torchneuron.migrate.parity import main as parity

    return parity(args.script, args.script_args, rtol=args.rtol, atol=args.atol, json_path=args.json)


def _add_project_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``project`` subcommand."""
    parser.add_argument("--target", default="trn1.32xlarge,trn2.48xlarge",
                        help="instances to project on, comma-separated (default: trn1.32xlarge,trn2.48xlarge); "
                             "NAME@tp=8:pp=2 gives one its own parallelism")
    parser.add_argument("--compare", default="p5.48xlarge",
                        help="instances to compare with, comma-separated (default: p5.48xlarge; '' for none); "
                             "NAME@tp=8:pp=2 as for --target")
    parser.add_argument("--fake", action="store_true",
                        help="run on fake tensors: nothing computed or allocated, values read back are 1")
    parser.add_argument("--mode", choices=("eager", "fused", "compiled"), default="eager",
                        help="eager pays a launch per op; fused runs each group between fused eager's cuts "
                             "(host reads, random ops, collectives) as one compiled graph; compiled fuses "
                             "non-matmul ops (default: eager)")
    parser.add_argument("--dp", type=_positive_int, default=None,
                        help="data-parallel replicas (default: as many as fill each instance, so that every "
                             "device paid for works; fewer leave devices idle, and the report shows their cost)")
    parser.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree (default: 1)")
    parser.add_argument("--pp", type=_positive_int, default=1, help="pipeline stages (default: 1)")
    parser.add_argument("--microbatches", type=_positive_int, default=1,
                        help="microbatches per optimizer step (default: 1)")
    parser.add_argument("--nodes", type=_positive_int, help="instances (default: the fewest that hold dp*tp*pp)")
    parser.add_argument("--no-zero1", dest="zero1", action="store_false", help="replicate optimizer state")
    parser.add_argument("--layers", type=int, default=0, help="transformer layers, for tp/pp traffic")
    parser.add_argument("--hidden", type=int, default=0, help="hidden size, for tp/pp traffic")
    parser.add_argument("--tokens-per-step", type=int, default=0, help="tokens per counted step, if the script does not say")
    parser.add_argument("--samples-per-step", type=int, default=0, help="samples per counted step, if the script does not say")
    parser.add_argument("--list-targets", action="store_true", help="print the known instances and exit")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--trace", metavar="FILE",
                        help="write the projected device timeline of one step per target as a Chrome trace")
    parser.add_argument("--count-every-step", action="store_true",
                        help="count every step op by op (default: the first two; later steps are watched "
                             "through PyTorch's profiler and carry the counts of the step they repeat)")
    parser.add_argument("--price", action="append", default=[], metavar="NAME=USD",
                        help="on-demand USD per instance-hour for NAME, in place of the data file's (repeatable; "
                             "for instances without a published price, or your own rate)")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="SCRIPT is a module, run as `python -m` runs it (e.g. -m torchneuron.projection.workloads gpt)")
    parser.add_argument("--model-config", metavar="NAME|CONFIG.json",
                        help="a script that serves with vLLM: project this model at the schedule the script's "
                             "engine ran (a name such as llama3-8b, or a Hugging Face config.json or its "
                             "directory) instead of the model it served")
    parser.add_argument("script", nargs="?", help="the Python program to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="its arguments (after `--`, all of them, even ones named like ours)")
    # Not given: eager and one device for a counted program; for a served workload, the engine's mode
    # and the fewest devices per replica that hold the model.
    parser.set_defaults(mode=None, tp=None)


def _run_project(args: argparse.Namespace) -> int:
    """Count a program's work while it runs and project its step time and cost on other hardware."""
    import json
    import logging

    from torchneuron import projection

    if args.list_targets:
        for name in projection.targets():
            t = projection.get_target(name)
            print(f"{name:<18} {t.devices_per_instance:>3} x {t.chip['device_name']}")
        return 0
    if not args.script:
        print("torchneuron project: a script to run is required (or --list-targets)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    from torchneuron.projection import schedule

    if schedule.imports_vllm(args.script, args.module):
        return _run_project_served(args)
    if args.model_config:
        print("torchneuron project: --model-config is for a script that serves with vLLM", file=sys.stderr)
        return 2
    args.mode = args.mode or "eager"
    parallel = projection.Parallelism(dp=args.dp, tp=args.tp or 1, pp=args.pp, microbatches=args.microbatches,
                                      zero1=args.zero1, nodes=args.nodes)
    per_target = {}

    def parse(spec: str) -> str:
        name, _, options = spec.partition("@")
        projection.get_target(name)  # unknown names fail before the script runs
        fields = dict(vars(parallel))
        for item in filter(None, options.split(":")):
            key, _, value = item.partition("=")
            if key not in ("dp", "tp", "pp", "microbatches", "nodes"):
                raise SystemExit(f"torchneuron project: unknown option {key!r} in {spec!r} (dp, tp, pp, microbatches, nodes)")
            fields[key] = int(value)
        per_target[name] = projection.Parallelism(**fields)
        return name

    prices = {}
    for item in args.price:
        name, _, usd = item.partition("=")
        try:
            prices[name] = float(usd)
        except ValueError:
            raise SystemExit(f"torchneuron project: --price wants NAME=USD, got {item!r}") from None
    names = [parse(n) for n in args.target.split(",") if n]
    compare = [parse(n) for n in args.compare.split(",") if n]
    proj = projection.run_script(args.script, args.script_args, fake=args.fake,
                                 full_steps=None if args.count_every_step else 2, module=args.module)
    if args.tokens_per_step or args.samples_per_step:
        for step in proj.steps:
            step.tokens = step.tokens or args.tokens_per_step
            step.samples = step.samples or args.samples_per_step
    proj.declare(layers=args.layers, hidden=args.hidden)
    report = proj.project(names, compare=compare, parallel=per_target, mode=args.mode, prices=prices)
    print(report.format())
    print(f"(counted {len(proj.steps)} step(s) in {proj.wall_s:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2, default=str)
    if args.trace:
        report.write_chrome_trace(args.trace)
        print(f"projected timeline: {args.trace} (Chrome trace format; open in Perfetto or chrome://tracing)")
    return 0


def _parse_prices(items: Sequence[str]) -> dict:
    prices = {}
    for item in items:
        name, _, usd = item.partition("=")
        try:
            prices[name] = float(usd)
        except ValueError:
            raise SystemExit(f"torchneuron project: --price wants NAME=USD, got {item!r}") from None
    return prices


def _run_project_served(args: argparse.Namespace) -> int:
    """Run a script that serves with vLLM, unchanged, record what its engine scheduled, and project
    that served workload on the targets (see torchneuron.projection.schedule)."""
    import json
    import time

    from torchneuron import projection
    from torchneuron.projection import schedule
    from torchneuron.vllm.schedule_format import ENV

    if args.fake:
        print("torchneuron project: --fake does not apply to a script that serves with vLLM (its engine's "
              "schedule is recorded from a real run; --model-config projects a larger model at that schedule)",
              file=sys.stderr)
        return 2
    tp = {}

    def parse(spec: str) -> str:
        name, _, options = spec.partition("@")
        projection.get_target(name)  # unknown names fail before the script runs
        for item in filter(None, options.split(":")):
            key, _, value = item.partition("=")
            if key != "tp":
                raise SystemExit(f"torchneuron project: a served workload takes tp only ({key!r} in {spec!r}): "
                                 "every device of an instance serves a replica")
            tp[name] = int(value)
        if name not in tp and args.tp:
            tp[name] = args.tp
        return name

    names = [parse(n) for n in args.target.split(",") if n]
    compare = [parse(n) for n in args.compare.split(",") if n]
    prices = _parse_prices(args.price)
    if args.model_config:
        schedule.resolve_model(args.model_config, {})  # a wrong name fails before the script runs
    try:
        served, wall = schedule.run_served(args.script, args.script_args, ENV, module=args.module)
        start = time.perf_counter()
        report = schedule.project_schedule(served, names, compare, model=args.model_config,
                                           mode=args.mode, tp=tp, prices=prices)
    except (RuntimeError, ValueError) as e:
        if not str(e).startswith((args.script, "schedule:")):
            raise
        print(f"torchneuron project: {e}", file=sys.stderr)
        return 1
    print(report.format())
    # flush: vLLM's server may end the process without flushing Python's buffers.
    print(f"(recorded {len(served.steps)} engine step(s) while the script ran, {wall:.1f} s; "
          f"projected in {time.perf_counter() - start:.1f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2, default=str)
    return 0


def _add_memviz_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``memviz`` subcommand."""
    parser.add_argument("snapshot", metavar="SNAPSHOT",
                        help="a pickled memory snapshot (torch.neuron.memory._dump_snapshot, or an OOM dump)")
    parser.add_argument("-o", "--output", metavar="OUT.html",
                        help="the HTML file to write (default: SNAPSHOT with the suffix .html)")
    parser.add_argument("--kind", choices=("offline", "trace", "segments"), default="offline",
                        help="offline: torchneuron's page, self-contained (timeline of allocations, segments and "
                             "blocks, summary); trace, segments: PyTorch's memory visualizer (memory over time; "
                             "the allocator's state event by event), whose page needs a network connection to "
                             "load its script when it opens (default: offline)")
    parser.add_argument("--max-actions", type=_positive_int, default=None, metavar="N",
                        help="offline: draw the newest N actions of each device's trace (default: 20000)")


def _run_memviz(args: argparse.Namespace) -> int:
    """Write the HTML view of a memory snapshot: torchneuron's offline page, or PyTorch's renderers."""
    import os
    import pickle

    try:
        with open(args.snapshot, "rb") as f:
            snapshot = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        print(f"torchneuron memviz: cannot read {args.snapshot}: {e}", file=sys.stderr)
        return 2
    if not isinstance(snapshot, dict) or "segments" not in snapshot or "device_traces" not in snapshot:
        print(f"torchneuron memviz: {args.snapshot} is not a memory snapshot (no 'segments' and 'device_traces'); "
              "write one with torch.neuron.memory._dump_snapshot()", file=sys.stderr)
        return 2
    if args.kind == "offline":
        from torchneuron.tools import memviz

        html = memviz.render_html(snapshot, title=os.path.basename(args.snapshot),
                                  max_actions=args.max_actions or memviz.MAX_ACTIONS)
        where = "open it in a browser (it is self-contained: nothing is loaded when it opens)"
    else:
        from torch.cuda import _memory_viz

        html = _memory_viz.trace_plot(snapshot) if args.kind == "trace" else _memory_viz.segment_plot(snapshot)
        where = ("open it in a browser with a network connection (PyTorch's page loads its viewer script "
                 "from a public CDN when it opens); `--kind offline` writes a page that needs none")
    output = args.output or os.path.splitext(args.snapshot)[0] + ".html"
    with open(output, "w", encoding="utf-8") as f:
        f.write(html)
    entries = sum(len(t) for t in snapshot["device_traces"])
    print(f"wrote {output} ({len(snapshot['segments'])} segments, {entries} trace entries); {where}")
    return 0


def _add_traceviz_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of the ``traceviz`` subcommand."""
    parser.add_argument("trace", metavar="TRACE.json",
                        help="a Chrome trace (torch.profiler's export_chrome_trace, or the projection's --trace)")
    parser.add_argument("-o", "--output", metavar="OUT.html",
                        help="the HTML file to write (default: TRACE with the suffix .html)")
    parser.add_argument("--step", type=int, metavar="N",
                        help="draw the span of the slice ProfilerStep#N (torch.profiler's step N)")
    parser.add_argument("--window", metavar="START:END",
                        help="draw from START to END milliseconds after the trace's first event")
    parser.add_argument("--width", type=_positive_int, default=1600, help="drawing width in pixels (default 1600)")
    parser.add_argument("--flows", metavar="CAT[,CAT]",
                        help="draw only the flow arrows of these categories (e.g. ac2g: launches to kernels)")


def _run_traceviz(args: argparse.Namespace) -> int:
    """Write a self-contained HTML timeline of a Chrome trace."""
    import os

    from torchneuron.tools import traceviz

    window = None
    if args.window:
        try:
            a, b = (float(v) for v in args.window.split(":"))
        except ValueError:
            print(f"torchneuron traceviz: --window wants START:END in milliseconds, not {args.window!r}",
                  file=sys.stderr)
            return 2
        window = (a, b)
    try:
        events = traceviz.load_trace(args.trace)
        page = traceviz.render_html(events, title=os.path.basename(args.trace), window_ms=window, step=args.step,
                                    width=args.width,
                                    flow_cats=set(args.flows.split(",")) if args.flows else None)
    except traceviz.TraceError as e:
        print(f"torchneuron traceviz: {e}", file=sys.stderr)
        return 2
    output = args.output or os.path.splitext(args.trace)[0] + ".html"
    with open(output, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {output}; open it in a browser (it is self-contained: nothing is loaded when it opens)")
    return 0


COMMANDS: list[Command] = [
    Command(
        "demo",
        "train a small GPT on the reference device and on the device under test and compare the losses",
        _add_demo_arguments,
        _run_demo,
    ),
    Command("migrate", "rewrite CUDA-specific code into device-agnostic code (shows a diff; --write applies it)",
            _add_migrate_arguments, _run_migrate),
    Command("doctor", "run a program on neuron and report its ops, host-device syncs, copies, memory and "
            "graph breaks (--sanitize: its stream synchronization bugs)", _add_doctor_arguments, _run_doctor),
    Command("parity", "run a program on the CPU and on neuron and report the first loss that differs",
            _add_parity_arguments, _run_parity),
    Command("project", "count a program's work and project its step time and cost on Trainium and GPU "
            "instances (a projection, not a measurement)", _add_project_arguments, _run_project),
    Command("memviz", "write the HTML view of a memory snapshot (torch.neuron.memory._dump_snapshot): "
            "a self-contained page that works offline, or PyTorch's memory visualizer", _add_memviz_arguments,
            _run_memviz),
    Command("traceviz", "write a self-contained HTML timeline of a Chrome trace (torch.profiler's "
            "export_chrome_trace): processes, their threads and streams, slices and flow arrows",
            _add_traceviz_arguments, _run_traceviz),
]


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """Build the top-level parser with one subparser per command.

    Args:
        commands: the subcommands to register.
    """
    parser = argparse.ArgumentParser(prog="torchneuron", description="torchneuron: the 'neuron' device for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        sub_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub_parser)
        sub_parser.set_defaults(_run=command.run, _parser=sub_parser)
    return parser


def _take_tool_options(parser: argparse.ArgumentParser, args: argparse.Namespace, after: Sequence[str] = ()) -> None:
    """Give the tool the options of its own that stand after the script, up to a ``--``.

    ``torchneuron project train.py --fake --target trn1.32xlarge`` means ``--fake`` and
    ``--target`` for ``project``, as ``project --fake --target trn1.32xlarge train.py`` does; a
    script's option that shares a name with one of the tool's goes after ``--``
    (``project train.py -- --fake``): everything there (``after``) belongs to the script.
    """
    before = list(getattr(args, "script_args", None) or [])
    ours: List[str] = []
    theirs: List[str] = []
    i = 0
    while i < len(before):
        token = before[i]
        action = parser._option_string_actions.get(token.split("=", 1)[0]) if token.startswith("-") else None
        if action is None or action.dest == "help":
            theirs.append(token)
            i += 1
            continue
        takes = 0 if action.nargs == 0 or "=" in token else 1
        ours += before[i:i + 1 + takes]
        i += 1 + takes
    if ours:
        parser.parse_args(ours + [args.script], namespace=args)
    args.script_args = theirs + list(after)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the chosen command and return its exit code.

    Args:
        argv: command-line arguments without the program name.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the script's: split there before argparse, which would
    # drop the `--` and let the script's options pass for the tool's.
    cut = argv.index("--") if "--" in argv else len(argv)
    head, after = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(head) if "--" in argv else parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    if hasattr(args, "script_args"):
        if args.script is None and after:  # `project --fake -- train.py ...`
            args.script, after = after[0], after[1:]
        _take_tool_options(args._parser, args, after if "--" in argv else ())
    elif "--" in argv:
        args = parser.parse_args(argv)
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
