"""`parser="auto"`: tell a chat template's tool-call format from the tokenizer alone.

The template renders a known assistant turn with tool calls; the format is the first parser in
`DETECTION_ORDER` that reads exactly those calls back (names and schema-typed arguments). The
rendering adapts to what templates demand: arguments as JSON strings instead of objects (DeepSeek
V3), a system turn or none, 9-character call ids (Mistral), and a generation prompt that opens
a reasoning block (the reply is taken after the generation prompt, whatever it holds).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from toolgym.agents.parsers.base import ParsedMessage, Parser, type_arguments
from toolgym.agents.parsers.formats import PARSERS, parser_for_template
from toolgym.agents.parsers.library import tokenizer_parser, vllm_parser
from toolgym.envs.calls import ToolCall

# Specific markers first; formats whose text another format could also read come last.
DETECTION_ORDER = (
    "harmony",
    "gemma4",
    "functiongemma",
    "deepseek",
    "kimi_k2",
    "solar",
    "mistral",
    "apertus",
    "cohere",
    "nemotron_v2",
    "granite",
    "gigachat",
    "internlm2",
    "granite_20b_fc",
    "glm",
    "invoke",
    "xml_function",
    "functionary",
    "pythonic",
    "tool_calls_json",
    "hermes",
    "llama3",
    "functionary_v32",
    "json_calls",
)

_USER = "What is the weather in Paris?"
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }
    for name, description, properties in (
        (
            "get_weather",
            "Get the weather forecast for a city.",
            {
                "city": {"type": "string", "description": "The city."},
                "days": {"type": "integer", "description": "Days ahead."},
            },
        ),
        ("get_time", "Get the time in a time zone.", {"zone": {"type": "string"}}),
    )
]
PROBE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("get_time", {"zone": "UTC"}),
]


@dataclass(frozen=True)
class ProbeReply:
    """An assistant turn with tool calls as the template writes it, and how it was rendered."""

    text: str  # through the end-of-turn markup
    calls: int
    string_arguments: bool
    system: bool


def probe_messages(
    calls: list[tuple[str, dict]], string_arguments: bool = False, system: bool = False
) -> list[dict[str, Any]]:
    """A user turn and an assistant turn making `calls` (ids of 9 characters, as Mistral's
    templates require)."""
    tool_calls = [
        {
            "type": "function",
            "id": f"call{index:05d}",
            "function": {
                "name": name,
                "arguments": json.dumps(arguments) if string_arguments else arguments,
            },
        }
        for index, (name, arguments) in enumerate(calls)
    ]
    head = [{"role": "system", "content": "You are a helpful assistant."}] if system else []
    return [
        *head,
        {"role": "user", "content": _USER},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
    ]


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the model the probe tools at all (a
    template that ignores `tools` renders the same text with and without them)."""
    messages = [{"role": "user", "content": "hi"}]
    with_tools = tokenizer.apply_chat_template(messages, tools=PROBE_TOOLS, tokenize=False)
    return with_tools != tokenizer.apply_chat_template(messages, tokenize=False)


def render_probe(tokenizer: Any, calls: int = 2, **template_kwargs: Any) -> ProbeReply:
    """The text a model would write for the first `calls` probe calls (see `render_reply`)."""
    return render_reply(tokenizer, PROBE_CALLS[:calls], **template_kwargs)


def render_reply(
    tokenizer: Any, calls: list[tuple[str, dict]], **template_kwargs: Any
) -> ProbeReply:
    """An assistant turn making `calls` as the template writes it after its generation prompt,
    through the end-of-turn markup. Raises ValueError with each rendering's error when the
    template renders none of the variants."""
    errors = []
    for string_arguments in (False, True):
        for system in (False, True):
            messages = probe_messages(calls, string_arguments, system)
            try:
                head = _render(tokenizer, messages[:-1], True, template_kwargs)
                full = _render(tokenizer, messages, False, template_kwargs)
            except Exception as error:  # templates raise anything: TypeError, TemplateError
                errors.append(f"{type(error).__name__}: {error}")
                continue
            return ProbeReply(_reply(head, full), len(calls), string_arguments, system)
    raise ValueError(
        "the chat template cannot render an assistant turn with tool calls: " + "; ".join(errors)
    )


def detect_format(tokenizer: Any, **template_kwargs: Any) -> str:
    """The name of the format (a `PARSERS` key, `"tokenizer"`, or `"vllm:<name>"` where only
    one of vLLM's own tool parsers reads it and vLLM is installed) the template writes calls in.

    Raises ValueError naming the closest parsers and showing the rendered call when none fits.
    """
    replies, errors = [], []
    parsers = [(name, PARSERS[name]) for name in DETECTION_ORDER]
    if getattr(tokenizer, "response_template", None) is not None:
        parsers.insert(0, ("tokenizer", tokenizer_parser(tokenizer)))
    for calls in (2, 1):  # some templates refuse two calls in one turn (Llama 3.x)
        try:
            reply = render_probe(tokenizer, calls, **template_kwargs)
        except ValueError as error:
            errors.append(error)
            continue
        replies.append(reply)
        if (name := _first_reading(parsers, reply, tokenizer)) is not None:
            return name
    if not replies:
        raise errors[-1]
    if PROBE_CALLS[0][0] not in replies[-1].text:
        raise ValueError(
            "this chat template does not write tool calls: an assistant turn with tool_calls "
            f"renders as {replies[-1].text[-300:]!r}. Pass a tool-capable chat_template."
        )
    library = vllm_candidates(tokenizer)
    with _quiet("vllm"):  # vLLM's parsers log a traceback for each text they cannot read
        for reply in replies:
            if (name := _first_reading(library, reply, tokenizer)) is not None:
                return name
    raise ValueError(
        "could not tell this chat template's tool-call format: none of the parsers "
        f"({', '.join(DETECTION_ORDER)}{', and vLLM' * bool(library)}'s) reads back the calls "
        f"it renders; closest: {closest(parsers, replies[-1], tokenizer)}. Pass "
        f"parser=<name>, 'vllm:<name>' or a callable. The template wrote {PROBE_CALLS[0]} as:"
        f"\n{replies[-1].text[-600:]}"
    )


def _first_reading(parsers: list[tuple[str, Parser]], reply: ProbeReply, tokenizer: Any) -> Any:
    for text in reply_candidates(reply.text, tokenizer):
        for name, parser in parsers:
            if _reads_back(parser, text, reply.calls):
                return name
    return None


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)


# vLLM's parsers that read nothing (stubs) or need what a probe tokenizer lacks.
_VLLM_SKIP = {"openai", "hf"}


def vllm_candidates(tokenizer: Any) -> list[tuple[str, Parser]]:
    """vLLM's tool parsers as `("vllm:<name>", parser)`, typed by the probe tools (none where
    vLLM is not installed; a parser that cannot be built for this tokenizer is left out)."""
    if importlib.util.find_spec("vllm") is None:
        return []
    try:
        from vllm.tool_parsers import ToolParserManager

        names = sorted(ToolParserManager.list_registered())
    except Exception:  # an installed vLLM that cannot load here reads nothing
        return []
    found = []
    for name in names:
        if name in _VLLM_SKIP:
            continue
        try:
            found.append((f"vllm:{name}", vllm_parser(name, tokenizer, PROBE_TOOLS)))
        except Exception:  # a parser that needs tokens this tokenizer lacks, or a broken one
            continue
    return found


def closest(parsers: list[tuple[str, Parser]], reply: ProbeReply, tokenizer: Any) -> str:
    """The (at most three) parsers that came nearest to reading the reply back: the most
    probe calls read with the right name, then the fewest other calls, each with what it read."""
    expected = PROBE_CALLS[: reply.calls]
    scored = []
    for name, parser in parsers:
        for text in reply_candidates(reply.text, tokenizer):
            try:
                read = type_arguments(parser(text), PROBE_TOOLS).tool_calls
            except Exception:
                continue
            named = sum(getattr(c, "name", None) in dict(expected) for c in read)
            exact = sum(call in expected for call in _calls(ParsedMessage("", read)))
            if read:
                scored.append((-exact, -named, len(read), name, _describe(read)))
                break
    if not scored:
        return "no parser found a call in it"
    return "; ".join(f"{name} read {what}" for *_, name, what in sorted(scored)[:3])


def _describe(calls: list[Any]) -> str:
    said = [
        f"{call.name}({call.arguments})"
        if isinstance(call, ToolCall)
        else f"a malformed call ({call.reason})"
        for call in calls[:2]
    ]
    return ", ".join(said) + (f" and {len(calls) - 2} more" if len(calls) > 2 else "")


def detect_parser(tokenizer: Any, **template_kwargs: Any) -> Parser:
    """The parser for the tokenizer's chat template (see `detect_format`)."""
    name = detect_format(tokenizer, **template_kwargs)
    if name == "tokenizer":
        return tokenizer_parser(tokenizer)
    if name.startswith("vllm:"):
        return vllm_parser(name.removeprefix("vllm:"), tokenizer)
    template = template_kwargs.get("chat_template") or getattr(tokenizer, "chat_template", None)
    return parser_for_template(name, template)


def _reads_back(parser: Parser, text: str, calls: int) -> bool:
    try:
        parsed = parser(text)
    except Exception:  # a user-facing parser never raises; a tokenizer's parser might
        return False
    return _calls(type_arguments(parsed, PROBE_TOOLS)) == PROBE_CALLS[:calls]


def _calls(parsed: ParsedMessage) -> list[tuple[str | None, Any]]:
    return [(getattr(c, "name", None), getattr(c, "arguments", None)) for c in parsed.tool_calls]


def _render(tokenizer: Any, messages: list, generation_prompt: bool, kwargs: dict) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tools=PROBE_TOOLS,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        **kwargs,
    )


def _reply(head: str, full: str) -> str:
    """What `full` adds after the generation prompt of `head`, aligned on the last user turn
    (templates may rewrite the system part once an assistant turn exists)."""
    if _USER in head and _USER in full:
        head, full = head[head.rindex(_USER) :], full[full.rindex(_USER) :]
    pairs = enumerate(zip(head, full, strict=False))
    cut = next((i for i, (a, b) in pairs if a != b), min(len(head), len(full)))
    opening = full.rfind("<", 0, cut)
    if opening >= 0 and ">" not in full[opening:cut]:
        cut = opening  # the prompts part inside a tag (`<think>` vs `<tool_call>`): keep it whole
    return full[cut:]


_END_MARKERS = ("<|eot_id|>", "<|eom_id|>", "</s>", "<|call|>", "<|return|>", "<|end|>")


def reply_candidates(text: str, tokenizer: Any) -> list[str]:
    """The reply with 0, 1, 2, ... trailing special tokens removed: generation stops at the
    template's end-of-turn token, but which trailing token that is depends on the family (a
    call's own closing token can be special too, e.g. Gemma 4's `<tool_call|>`)."""
    markers = [m for m in {*getattr(tokenizer, "all_special_tokens", []), *_END_MARKERS} if m]
    candidates = [text.rstrip()]
    while True:
        last = candidates[-1]
        marker = next((m for m in sorted(markers, key=len, reverse=True) if last.endswith(m)), None)
        if marker is None:
            return candidates
        candidates.append(last[: -len(marker)].rstrip())
