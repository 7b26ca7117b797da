"""Text bound for a person's terminal, made inert: the one place the CLI escapes what the model
or an environment wrote before it is printed (`toolgym play`, `eval`, `envs`, error lines and
the log).

A terminal obeys the bytes it is sent: ESC starts sequences that clear the screen, retitle the
window, write the clipboard (OSC 52), draw links or move the cursor, and C1 controls (CSI as
one byte, 0x9b) do the same on some terminals. So every C0 control but newline and tab, DEL,
every C1 control, the bidirectional overrides (which reorder what a line appears to say) and
lone surrogates (which a UTF-8 stream cannot carry) are shown escaped, `\\x1b` or `\\u202e`:
the person sees what was sent, and the terminal receives no control. Standard library only.
"""

from __future__ import annotations

import logging
import re
from typing import Any

UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""What is escaped: C0 controls but tab and newline, DEL, C1 controls, the bidirectional
embeddings, overrides and isolates, and surrogates."""


def terminal_text(value: Any) -> str:
    """`value` as text with every `UNSAFE` character escaped (`\\x1b`, `\\u202e`)."""
    text = value if isinstance(value, str) else str(value)
    return UNSAFE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class TerminalFormatter(logging.Formatter):
    """A log formatter whose lines are `terminal_text` (the traceback of a record included):
    a log record quoting the model's or an environment's text drives no terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_text(super().format(record))


def _escape_message(record: logging.LogRecord) -> bool:
    """A handler filter: the record's message made `terminal_text` (for handlers someone
    else configured, whose formatter stays theirs)."""
    record.msg, record.args = terminal_text(record.getMessage()), None
    return True


def escape_log_output() -> None:
    """Route warnings into logging, and make the log safe for a terminal: a stderr handler
    with the `TerminalFormatter` where the root logger has none, else a filter on each of its
    handlers that escapes every record's message. For the commands that print episodes
    (`play`, `eval`), where a log line may quote the model."""
    logging.captureWarnings(True)
    root = logging.getLogger()
    if not root.handlers:
        stderr = logging.StreamHandler()
        stderr.setFormatter(TerminalFormatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stderr)
    for handler in root.handlers:
        if _escape_message not in handler.filters:
            handler.addFilter(_escape_message)
