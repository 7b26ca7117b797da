"""An episode printed for a person in a terminal (`toolgym play`), through `rich`.

Each message gets a header rule naming its role; the assistant's tool calls are listed as
`name(arguments)`, tool results under the tool's name, failed ones in red, and a last line
gives the status, reward, turns and tool calls. `rich` colours only a terminal: piped or
redirected, the same text comes out plain, without escape codes (and `NO_COLOR` is honoured).
Every piece of text from the model or the environment (contents, tool names, roles, errors,
metric names) goes through `toolgym.cli.terminal.terminal_text` first: it cannot drive the
terminal (clear it, retitle it, write the clipboard).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

from toolgym.agents.trajectory import INFRASTRUCTURE_FAILURES, MODEL_FAILURES, Trajectory
from toolgym.cli.terminal import terminal_text

ROLE_STYLES = {
    "system": "bold blue",
    "user": "bold cyan",
    "assistant": "bold green",
    "tool": "bold magenta",
}
"""The header style of each role's messages."""

STATUS_STYLES = {
    "finished": "green",
    "env_done": "green",
    "max_turns": "yellow",
    "length": "yellow",
    **dict.fromkeys(sorted(MODEL_FAILURES), "magenta"),
}
"""The style of the final line by status: the model's failures (`tool_timeout`, `tool_crash`,
`too_many_calls`: in the loss) magenta, infrastructure failures (left out of it) red."""


def is_tool_failure(message: dict[str, Any]) -> bool:
    """Whether a `role: tool` message reports a failed call: its `failure` (the failure's
    kind, None for a call that worked); files written before tool messages carried it fall
    back to the `Error: ...` wording toolgym gives every failure."""
    if "failure" in message:
        return bool(message["failure"])
    content = str(message.get("content") or "")
    return message.get("name") == "invalid_tool_call" or content.startswith("Error:")


def print_trajectory(trajectory: Trajectory, console: Console | None = None) -> None:
    """Print every message of `trajectory`, then its status line (and its error, if any)."""
    console = console or Console()
    for message in trajectory.messages:
        print_message(message, console)
    print_outcome(trajectory, console)


def print_outcome(trajectory: Trajectory, console: Console) -> None:
    """The status line, the error if any, and the environment's skill metrics."""
    console.print(status_line(trajectory), soft_wrap=True)
    if trajectory.env_metrics:
        skills = " · ".join(f"{_text(k)} {v:g}" for k, v in trajectory.env_metrics.items())
        console.print(Text(f"    {skills}", style="dim"), soft_wrap=True)
    if trajectory.error:
        console.print(Text(f"error: {_text(trajectory.error)}", style="bold red"), soft_wrap=True)


def print_message(message: dict[str, Any], console: Console) -> None:
    """One message: a header rule, then its text (and, for the assistant, its calls)."""
    role = _text(message.get("role", "?"))
    if role == "tool":
        failed = is_tool_failure(message)
        title = f"tool {_text(message.get('name', ''))}".rstrip() + (" (failed)" if failed else "")
        console.rule(Text(title, style="bold red" if failed else ROLE_STYLES["tool"]), align="left")
        console.print(Text(_text(message.get("content")), style="red" if failed else ""))
        return
    console.rule(Text(role, style=ROLE_STYLES.get(role, "bold")), align="left")
    if message.get("reasoning_content"):
        console.print(Text(_text(message["reasoning_content"]), style="dim italic"))
    if _text(message.get("content")).strip():
        console.print(Text(_text(message.get("content"))))
    for call in message.get("tool_calls") or []:
        console.print(call_text(call), soft_wrap=True)


def call_text(call: dict[str, Any]) -> Text:
    """`→ name({"argument": value})` for an OpenAI-style tool call (a malformed one in red)."""
    function = call.get("function", call)
    name = str(function.get("name", "?"))
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    style = "red" if name == "invalid_tool_call" else "yellow"
    name, arguments = _text(name), _text(arguments)
    return Text.assemble(("→ ", style), (name, f"bold {style}"), (f"({arguments})", style))


def status_line(trajectory: Trajectory) -> Text:
    """`status env_done · reward 1.000 · turns 3 · tool calls 3 (1 failed)`, coloured."""
    metrics = trajectory.metrics
    style = "bold red" if trajectory.status in INFRASTRUCTURE_FAILURES else "bold"
    parts = [
        f"status {_text(trajectory.status)}",
        "reward none" if trajectory.reward is None else f"reward {trajectory.reward:.3f}",
        f"turns {metrics.get('turns', 0):.0f}",
        f"tool calls {metrics.get('tool_calls', 0):.0f} "
        f"({metrics.get('tool_failures', 0):.0f} failed)",
    ]
    text = Text("=== ", style=style)
    text.append(parts[0], style=f"{style} {STATUS_STYLES.get(trajectory.status, '')}".strip())
    text.append(" · " + " · ".join(parts[1:]), style=style)
    return text


def _text(value: Any) -> str:
    """Message content as text (multimodal content lists keep their text parts), made safe for
    the terminal (`terminal_text`): text the model wrote must not drive it (clear it,
    retitle it, write the clipboard or links)."""
    if value is None:
        return ""
    if isinstance(value, list):
        value = "\n".join(str(part.get("text", part)) for part in value if isinstance(part, dict))
    return terminal_text(value)
