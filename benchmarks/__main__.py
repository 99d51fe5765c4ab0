"""Entry point for `python -m benchmarks`: runs every suite."""

import sys

from benchmarks.run_all import main

sys.exit(main(prog="python -m benchmarks"))
