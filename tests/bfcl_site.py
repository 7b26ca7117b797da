"""bfcl-eval for the tests: the package from `.bench/site` (installed there first if the set-up
has not; `--no-deps`: its tool classes need only mpmath), on `sys.path` while in use, and
BFCL's own way of writing a call read back into a tool call."""

from __future__ import annotations

import ast
import contextlib
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SITE = Path(__file__).resolve().parent.parent / ".bench" / "site"
BFCL_VERSION = "2026.3.23"  # scripts/setup.sh installs the same


@contextlib.contextmanager
def bfcl_on_path() -> Iterator[Path]:
    """bfcl_eval importable while inside; yields its package folder."""
    if not (SITE / "bfcl_eval").is_dir():
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        subprocess.run([*command, "--target", str(SITE), f"bfcl-eval=={BFCL_VERSION}"], check=True)
    sys.path.insert(0, str(SITE))
    try:
        import bfcl_eval

        yield Path(bfcl_eval.__file__).parent
    finally:
        sys.path.remove(str(SITE))


def named_call(text: str, method: Any) -> tuple[str, dict[str, Any]]:
    """A call as BFCL writes it (`sort('a.pdf')`, `cd(folder='x')`) -> its name and its
    arguments by name (as a model sends them), bound by `method`'s signature."""
    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    args = [ast.literal_eval(arg) for arg in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    bound = inspect.signature(method).bind(*args, **kwargs).arguments
    return call.func.id, dict(bound)
