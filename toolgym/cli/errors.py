"""`CLIError`: bad input on the command line, reported as one line and exit code 2."""

from __future__ import annotations


class CLIError(Exception):
    """A mistake in what the user asked for (a missing file, an unknown key, ...): `main`
    prints its message on one line, without a traceback, and exits with code 2."""
