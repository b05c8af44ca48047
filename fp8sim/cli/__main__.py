"""``python -m fp8sim.cli``: the ``fp8sim`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
