"""Run the operator and model suites one after the other and print both tables."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.append(_root)

from benchmarks import bench_models, bench_ops
from benchmarks.common import main as run_main

SUITES = [bench_ops.SUITE, bench_models.SUITE]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run every suite and return the exit status.

    Args:
        argv: arguments without the program name; None reads sys.argv.
        prog: program name for usage lines; None uses sys.argv[0].
    """
    return run_main(SUITES, argv, description="torchneuron benchmarks: every suite, neuron versus CPU", prog=prog)


if __name__ == "__main__":
    sys.exit(main())
