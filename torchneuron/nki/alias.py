"""``python -m torchneuron.nki.alias script.py [args]`` (or ``-m module [args]``): run AWS NKI code with the
import alias installed (see :mod:`torchneuron.nki._alias`)."""

import sys

from ._alias import aliased, install_alias, main, uninstall_alias  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
