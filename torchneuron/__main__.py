"""Entry point for ``python -m torchneuron``."""

import sys

from torchneuron.cli import main

sys.exit(main())
