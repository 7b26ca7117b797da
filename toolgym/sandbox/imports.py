"""What a worker needs to import an environment class, and nothing beside it."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLGYM_SOURCE = Path(__file__).resolve().parent.parent
"""The `toolgym` package folder."""


def module_root(target: type | None) -> Path | None:
    """The file of `target`'s top-level module, or the folder of its top-level package: what
    a worker must see to import the class (sibling files stay out of reach). None for classes
    without a module file, and for toolgym's own."""
    if target is None:
        return None
    module = sys.modules.get(target.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    depth = target.__module__.count(".")
    if path.name == "__init__.py":  # a package: `a/__init__.py`, `a/b/__init__.py`, ...
        root = path.parents[depth]
    else:  # a module: `a.py` itself, or the folder `a` of `a/b.py`, `a/b/c.py`, ...
        root = path.parents[depth - 1] if depth else path
    inside_toolgym = root == TOOLGYM_SOURCE or TOOLGYM_SOURCE in root.parents
    return None if inside_toolgym else root
