"""Build the API reference (HTML, pdoc) from the docstrings: `make docs`, or
`python scripts/api_docs.py OUTPUT_DIR`. Every public module gets a page."""

from __future__ import annotations

import pkgutil
import sys
import warnings
from pathlib import Path

import pdoc

import toolgym


def public_modules() -> list[str]:
    """`toolgym` and every module under it whose path has no `_`-prefixed part."""
    names = ["toolgym"]
    for info in pkgutil.walk_packages(toolgym.__path__, "toolgym."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def main(output: str = "docs/api") -> None:
    """Write the reference to `output` (one HTML page per module, and an index)."""
    with warnings.catch_warnings():  # lazily loaded names of a package's __all__
        warnings.simplefilter("ignore")
        pdoc.pdoc(*public_modules(), output_directory=Path(output))


if __name__ == "__main__":
    main(*sys.argv[1:])
