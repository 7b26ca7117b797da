"""`python -m toolgym ...`: the `toolgym` command (also `accelerate launch -m toolgym train`)."""

from __future__ import annotations

import sys

from toolgym.cli import main

if __name__ == "__main__":
    sys.exit(main())
