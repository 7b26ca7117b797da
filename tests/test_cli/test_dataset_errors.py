"""JSONL prompt datasets (`--dataset` of `toolgym play`/`eval`/`train`): a hostile file is a
named one-line error with its file and line, never a traceback; lines end at `\\n` only."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from toolgym.cli import main
from toolgym.cli.env_spec import read_rows
from toolgym.cli.errors import CLIError

GOOD = b'{"prompt": "fine"}\n'


def _dataset(tmp_path: Path, *lines: bytes, name: str = "rows.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(lines))
    return path


def _error(path: Path) -> str:
    with pytest.raises(CLIError) as raised:
        read_rows(path)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_invalid_utf8_names_the_line(tmp_path):
    path = _dataset(tmp_path, GOOD, GOOD, b'{"prompt": "caf\xe9"}\n', GOOD)
    assert _error(path) == f"{path}, line 3: not UTF-8 (byte 0xe9 at byte 16 of the line)"


def test_deep_nesting_names_the_line(tmp_path):
    path = _dataset(tmp_path, GOOD, b"[" * 100_000 + b"]" * 100_000 + b"\n")
    assert _error(path) == f"{path}, line 2: JSON nested too deeply to read"
    path = _dataset(tmp_path, GOOD, b'{"prompt": "x", "a": ' + b"[" * 100_000 + b"\n")
    assert _error(path) == f"{path}, line 2: JSON nested too deeply to read"


def test_a_huge_integer_names_the_line(tmp_path):
    path = _dataset(tmp_path, b'{"prompt": "x", "n": ' + b"7" * 5_000 + b"}\n")
    message = _error(path)
    assert re.fullmatch(
        rf"{re.escape(str(path))}, line 1: an integer longer than .* digits", message
    )
    if hasattr(sys, "get_int_max_str_digits"):
        assert f"longer than {sys.get_int_max_str_digits()} digits" in message


def test_line_separators_inside_a_row_are_text(tmp_path):
    prompt = "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg"
    row = json.dumps({"prompt": prompt, "note": "x\u2028y"}, ensure_ascii=False)
    path = _dataset(tmp_path, row.encode() + b"\r\n", GOOD)
    rows = read_rows(path)
    assert [r["prompt"] for r in rows] == [prompt, "fine"]
    assert rows[0]["note"] == "x\u2028y"


def test_lines_end_at_newline_and_a_trailing_carriage_return_is_dropped(tmp_path):
    path = _dataset(tmp_path, GOOD, b"\r\n", b'{"prompt": "b"}\r\n', b"\n", b'{"prompt": "c"}')
    assert [r["prompt"] for r in read_rows(path)] == ["fine", "b", "c"]
    broken = _dataset(tmp_path, GOOD, b"\n", b"{oops\r\n", name="broken.jsonl")
    assert _error(broken).startswith(f"{broken}, line 3: not JSON (")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"prompt": "\xff"}\n', "line 1: not UTF-8"),
        (b"[" * 100_000 + b"\n", "line 1: JSON nested too deeply to read"),
        (b'{"prompt": "x", "n": ' + b"1" * 5_000 + b"}\n", "line 1: an integer longer than"),
    ],
)
def test_the_cli_reports_a_hostile_dataset_in_one_line(tmp_path, capsys, content, expected):
    rows = _dataset(tmp_path, content, name="hostile.jsonl")
    # the rows are read before the model (never loaded here)
    for command in ("play", "eval"):
        argv = [command, "Wordle-v0", "--dataset", str(rows), "--model", "never-loaded"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"toolgym {command}: error: {rows}, {expected}" in err
