"""Is a chat template prefix-preserving for the turns a model actually writes?

An exact-token episode keeps the model's own ids and appends the template's suffix ids after
each turn. That sequence is what the template would render for the conversation exactly when
every step of a tool round trip only appends text: the model's turn after the generation
prompt, the tool turn after the model's turn, the next turn after the next generation prompt.
Templates differ in what they rewrite, and often only for some shapes of turn: Gemma 4 moves
text written beside a call, Nemotron 3 rewrites a turn without reasoning to `<think></think>`,
DeepSeek V3 drops earlier reasoning. So the check runs one round trip per shape a model
emits (a bare call, a call with text, a call with reasoning) and reports each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
Render = Callable[[list[Message], bool], str]

PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "description": "What to look up."}},
                "required": ["key"],
            },
        },
    }
]
_CALL = {
    "type": "function",
    "id": "call00001",
    "function": {"name": "lookup", "arguments": {"key": "k"}},
}
_REASONING = "I should look it up."
SHAPES: dict[str, Message] = {
    "a bare tool call": {"content": ""},
    "a tool call with text beside it": {"content": "Let me check."},
    "a tool call with reasoning": {
        "content": "",
        "reasoning_content": _REASONING,
        "thinking": _REASONING,
        "reasoning": _REASONING,
    },
}


@dataclass(frozen=True)
class ShapeVerdict:
    """Whether one shape of tool-call turn survives a round trip; where the text changes."""

    shape: str
    ok: bool
    problem: str = ""


@dataclass(frozen=True)
class PrefixReport:
    """The verdict for each shape of turn."""

    verdicts: tuple[ShapeVerdict, ...]

    @property
    def prefix_preserving(self) -> bool:
        """Whether every checked shape of turn keeps the earlier text as a prefix."""
        return all(verdict.ok for verdict in self.verdicts)

    def describe(self) -> str:
        """One line per shape: its verdict, and where the text changes."""
        lines = [
            f"- {v.shape}: "
            + ("prefix-preserving" if v.ok else f"NOT prefix-preserving: {v.problem}")
            for v in self.verdicts
        ]
        return "\n".join(lines)


def check_prefix_preserving(render: Render, system: bool = True) -> PrefixReport:
    """Run a tool round trip for each shape in `SHAPES`.

    Args:
        render: `render(messages, add_generation_prompt) -> text` with the probe tools.
        system: Start the conversation with a system turn (some templates refuse one).
    """
    return PrefixReport(tuple(_round_trip(render, shape, system) for shape in SHAPES))


def _round_trip(render: Render, shape: str, system: bool) -> ShapeVerdict:
    head = [{"role": "system", "content": "s"}] if system else []
    conversation: list[Message] = [
        *head,
        {"role": "user", "content": "u"},
        {"role": "assistant", **SHAPES[shape], "tool_calls": [_CALL]},
        {"role": "tool", "name": "lookup", "tool_call_id": "call00001", "content": "v"},
        {"role": "assistant", "content": "done"},
    ]
    for length in range(len(head) + 1, len(conversation)):
        added = conversation[length]
        shorter = render(conversation[:length], added["role"] == "assistant")
        longer = render(conversation[: length + 1], False)
        if not longer.startswith(shorter):
            step = "the model's turn" if added["role"] == "assistant" else "the tool result"
            if length == len(conversation) - 1:
                step = "the next turn"
            return ShapeVerdict(shape, False, divergence(f"adding {step}", shorter, longer))
    return ShapeVerdict(shape, True)


def divergence(step: str, shorter: str, longer: str) -> str:
    """Where `longer` stops extending `shorter`, with the text around it."""
    pairs = enumerate(zip(shorter, longer, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(shorter), len(longer)))
    window = slice(max(0, at - 40), at + 40)
    return (
        f"{step} changes earlier text at character {at}: before {shorter[window]!r}, "
        f"after {longer[window]!r}"
    )
