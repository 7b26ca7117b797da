"""Print the classes and functions of `toolgym/` that are long enough to be worth a look.

Advice, not a rule (no test fails on a length): a class past 300 lines or a function past 60
often holds more than one job. Split it where its responsibilities part, never by squeezing
lines under the number.

    python scripts/long_code.py [--class-lines 300] [--function-lines 60]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "toolgym"


def long_definitions(class_lines: int, function_lines: int) -> list[tuple[int, str, str]]:
    """(lines, kind, "module.py:line name") of every definition past its limit."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                kind, limit = "class", class_lines
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kind, limit = "function", function_lines
            else:
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                found.append((length, kind, where))
    return sorted(found, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class-lines", type=int, default=300)
    parser.add_argument("--function-lines", type=int, default=60)
    args = parser.parse_args()
    for length, kind, where in long_definitions(args.class_lines, args.function_lines):
        print(f"{length:5d} lines  {kind:8s}  {where}")


if __name__ == "__main__":
    main()
