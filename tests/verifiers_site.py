"""verifiers for the tests: the package from `.bench/site` (installed there first if the set-up
has not), on `sys.path` while in use. `--no-deps` with the modules its import needs: verifiers
0.1.14's declared requirements pull in far more (and its newer releases pin an `mcp` that
toolgym's own MCP support cannot run beside)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SITE = Path(__file__).resolve().parent.parent / ".bench" / "site"
PACKAGES = [  # scripts/setup.sh installs the same
    "verifiers==0.1.14",
    "tenacity==9.2.1",
    "aiolimiter==1.3.0",
    "aiofiles==25.1.0",
    "prime-sandboxes==0.2.21",
    "connectrpc==0.9.0",
    "pyqwest==0.12.0",
]


@contextlib.contextmanager
def verifiers_on_path() -> Iterator[None]:
    """verifiers importable while inside."""
    if not (SITE / "verifiers").is_dir():
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        subprocess.run([*command, "--target", str(SITE), *PACKAGES], check=True)
    sys.path.insert(0, str(SITE))
    try:
        yield
    finally:
        sys.path.remove(str(SITE))
