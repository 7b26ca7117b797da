"""A temporary folder for one bench run, removed when the process exits."""

from __future__ import annotations

import atexit
import shutil
import tempfile


def run_folder(prefix: str = "toolgym-bench-") -> str:
    """A fresh folder under the temporary directory, removed at exit (the benches write
    models and run outputs there; CI runs them, and nothing of theirs may stay behind)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
