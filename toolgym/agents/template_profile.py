"""What a chat template needs and does, learned once into a frozen `TemplateProfile`.

`profile_template` renders a few probe conversations through the tokenizer's template (or the
one given) and records what every later rendering relies on: whether tool-call arguments must
be JSON strings, whether a system turn is accepted, the special token that closes an assistant
turn (and what follows it), a second token that closes a turn of calls (Gemma 4, harmony), the
stop ids, the prefix-preservation verdict for each shape of turn (`template_check`), and from
that verdict how episodes are built: one sequence, a training template for a recognised family
(Qwen3), or one sample per turn. `ChatRenderer` renders with a profile and never re-learns it;
a profile can be handed to another renderer of the same tokenizer (the warm-up's, say).
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from typing import Any

from toolgym.agents.images import template_content
from toolgym.agents.parsers.detect import ProbeReply, render_probe
from toolgym.agents.template_check import (
    PROBE_TOOLS,
    PrefixReport,
    check_prefix_preserving,
    divergence,
)
from toolgym.agents.templates import training_template_for

Message = dict[str, Any]
logger = logging.getLogger(__name__)

PROBE_CALL: dict[str, Any] = {
    "type": "function",
    "id": "call00001",
    "function": {"name": "lookup", "arguments": {"key": "k"}},
}
_PROBE_CONTENT = "PROBE-CONTENT"
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(ValueError):
    """The chat template cannot be used for multi-turn episodes."""


@dataclass(frozen=True)
class TemplateProfile:
    """What one chat template needs and does, for one tokenizer (see `profile_template`).

    Attributes:
        chat_template: The template to render with (None: the tokenizer's own); toolgym's
            training template when one replaced the family's own (`training_template`).
        string_arguments: The template wants tool-call arguments as JSON strings.
        system: The template accepts a system turn.
        end_of_turn: The special token that closes an assistant turn (`<|im_end|>`).
        after_end_of_turn: The text the template writes right after it (a newline, say).
        end_opens_next_turn: The end of a turn is the next turn's opening token instead (GLM:
            the model stops by writing `<|observation|>`).
        end_of_turn_id: The id of `end_of_turn`.
        call_end: A second special token that closes a turn of tool calls, if any.
        call_end_id: Its id.
        stop_token_ids: Every id generation stops on (end of turn, call end, EOS, next-turn
            openers), sorted.
        prefix_report: The prefix-preservation verdict for each shape of tool-call turn.
        training_template: The family whose training template is used, if one is.
        per_turn: Episodes are built one sample per turn (True) or as one sequence (False).
    """

    chat_template: str | None
    string_arguments: bool
    system: bool
    end_of_turn: str
    after_end_of_turn: str
    end_opens_next_turn: bool
    end_of_turn_id: int
    call_end: str | None
    call_end_id: int | None
    stop_token_ids: tuple[int, ...]
    prefix_report: PrefixReport
    training_template: str | None
    per_turn: bool


def profile_template(
    tokenizer: Any,
    chat_template: str | None = None,
    per_turn: bool | None = None,
    training_templates: bool = True,
    **template_kwargs: Any,
) -> TemplateProfile:
    """Learn what `chat_template` (default: the tokenizer's) needs and does.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
        chat_template: A template to use instead of the tokenizer's own.
        per_turn: Build episodes one sample per turn (True), as one sequence (False, refused
            for templates that are not prefix-preserving), or as the template allows (None).
        training_templates: With `per_turn=None`, replace a recognised family's template that
            is not prefix-preserving by toolgym's training template for it (Qwen3).
        template_kwargs: Extra template variables for every rendering (`enable_thinking`, ...).

    Raises:
        TemplateError: The template cannot render tool calls and results, has no special
            end-of-turn token, or is not prefix-preserving where `per_turn=False` needs it.
    """
    probe = _Profiler(tokenizer, chat_template, template_kwargs)
    end_of_turn, after_end_of_turn, end_opens_next_turn = probe.end_of_turn()
    end_of_turn_id = probe.single_token_id(end_of_turn)
    probe.check_calls_fit_in_one_turn(end_of_turn, end_opens_next_turn)
    call_end = None if end_opens_next_turn else probe.call_end(end_of_turn)
    call_end_id = probe.single_token_id(call_end) if call_end else None
    stops = {end_of_turn_id, call_end_id, *eos_ids(tokenizer)}
    if end_opens_next_turn:  # a final answer ends where the user's next turn opens
        stops |= {probe.single_token_id(token) for token in probe.next_turn_openers()}
    report = probe.prefix_report()
    training_template = None
    if per_turn is None and training_templates and not report.prefix_preserving:
        swapped = probe.with_training_template(report)
        if swapped is not None:
            training_template, report = swapped
    return TemplateProfile(
        chat_template=probe.chat_template,
        string_arguments=probe.string_arguments,
        system=probe.system,
        end_of_turn=end_of_turn,
        after_end_of_turn=after_end_of_turn,
        end_opens_next_turn=end_opens_next_turn,
        end_of_turn_id=end_of_turn_id,
        call_end=call_end,
        call_end_id=call_end_id,
        stop_token_ids=tuple(sorted(stop for stop in stops if stop is not None)),
        prefix_report=report,
        training_template=training_template,
        per_turn=_choose_per_turn(per_turn, report),
    )


def render_conversation(
    tokenizer: Any,
    messages: list[Message],
    tools: list[dict] | None,
    add_generation_prompt: bool,
    *,
    chat_template: str | None,
    string_arguments: bool,
    template_kwargs: dict[str, Any],
) -> str:
    """The conversation as the chat template writes it (text)."""
    return tokenizer.apply_chat_template(
        messages_for_template(messages, string_arguments),
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        **template_kwargs,
    )


def messages_for_template(messages: list[Message], string_arguments: bool) -> list[Message]:
    """Messages as a template reads them: reasoning under each key templates use, arguments
    as JSON strings where wanted, no empty `tool_calls`, images as blocks."""
    messages = [template_content(m) for m in messages]
    if not string_arguments and not any(_needs_conversion(m) for m in messages):
        return messages
    converted = copy.deepcopy(messages)
    for message in converted:
        if message.get("tool_calls") == []:
            del message["tool_calls"]  # Llama 3's template raises on an empty list
        if _REASONING_KEYS[0] in message:
            for key in _REASONING_KEYS[1:]:
                message.setdefault(key, message[_REASONING_KEYS[0]])
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            if string_arguments and not isinstance(function.get("arguments"), str):
                function["arguments"] = json.dumps(function.get("arguments", {}))
    return converted


def token_encoder(tokenizer: Any) -> Any:
    """text -> tuple of ids without special tokens added; the Rust tokenizer directly when the
    tokenizer is a fast one (the same ids, without transformers' per-call overhead)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: tuple(backend.encode(text, add_special_tokens=False).ids)
    return lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))


def eos_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's end-of-sequence id(s)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


class _Profiler:
    """Renders probe conversations through one template; each finding is a method."""

    def __init__(
        self, tokenizer: Any, chat_template: str | None, template_kwargs: dict[str, Any]
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        self._encode = token_encoder(tokenizer)
        self._probes: dict[int, ProbeReply | ValueError] = {}
        self.string_arguments, self.system = self._needs()

    def render(
        self, messages: list[Message], tools: list[dict] | None, prompt: bool = False
    ) -> str:
        return render_conversation(
            self.tokenizer,
            messages,
            tools,
            prompt,
            chat_template=self.chat_template,
            string_arguments=self.string_arguments,
            template_kwargs=self.template_kwargs,
        )

    def single_token_id(self, token: str) -> int:
        ids = self._encode(token)
        if len(ids) != 1:
            raise TemplateError(f"end-of-turn {token!r} is not a single token: {list(ids)}")
        return ids[0]

    def probe(self, calls: int) -> ProbeReply:
        """The template's assistant turn with `calls` probe calls, rendered once (several
        checks read it); ValueError when the template cannot render it."""
        if calls not in self._probes:
            kwargs = {"chat_template": self.chat_template, **self.template_kwargs}
            try:
                self._probes[calls] = render_probe(self.tokenizer, calls, **kwargs)
            except ValueError as error:
                self._probes[calls] = error
        found = self._probes[calls]
        if isinstance(found, ValueError):
            raise found
        return found

    def _needs(self) -> tuple[bool, bool]:
        """(arguments as JSON strings, a system turn is accepted), from a probe tool call."""
        try:
            probe = self.probe(1)
        except ValueError as error:
            raise TemplateError(
                f"{error}. toolgym needs a template that renders assistant tool calls and tool "
                "results; pass chat_template=..."
            ) from None
        if probe.system:  # it refused to render without one
            return probe.string_arguments, True
        try:
            self.tokenizer.apply_chat_template(
                [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                tokenize=False,
                chat_template=self.chat_template,
                **self.template_kwargs,
            )
        except Exception:
            return probe.string_arguments, False
        return probe.string_arguments, True

    def prefix_report(self) -> PrefixReport:
        return check_prefix_preserving(
            lambda messages, prompt: self.render(messages, PROBE_TOOLS, prompt), self.system
        )

    def with_training_template(self, original: PrefixReport) -> tuple[str, PrefixReport] | None:
        """Swap in toolgym's training template for a recognised family, if it passes: the
        family and its report; None (and the original template kept) otherwise."""
        own = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        found = training_template_for(own if isinstance(own, str) else None)
        if found is None:
            return None
        family, template = found
        kept = self.chat_template
        self.chat_template = template
        report = self.prefix_report()
        if not report.prefix_preserving:  # keep the original; train per turn
            self.chat_template = kept
            return None
        self._probes.clear()  # they rendered the original template
        logger.info(
            "the %s chat template is not prefix-preserving:\n%s\nusing toolgym's %s training "
            "template instead (it keeps every turn's <think> block)",
            family,
            original.describe(),
            family,
        )
        return family, report

    def end_of_turn(self) -> tuple[str, str, bool]:
        """The special token that closes an assistant turn (e.g. `<|im_end|>`), the text after
        it, and whether it is the next turn's opening token instead (GLM: the model stops by
        writing `<|observation|>`, which the template writes as the tool turn's start)."""
        text = self.render(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE_CONTENT}],
            PROBE_TOOLS,
        )
        tail = text[text.rindex(_PROBE_CONTENT) + len(_PROBE_CONTENT) :]
        found = _leading_special_token(self.tokenizer, tail)
        if found is not None:
            return found[0], found[1], False
        before_tool: list[Message] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PROBE_CONTENT, "tool_calls": [PROBE_CALL]},
        ]
        head = self.render(before_tool, PROBE_TOOLS)
        full = self.render(
            [*before_tool, {"role": "tool", "name": "lookup", "content": "v"}], PROBE_TOOLS
        )
        after = full[len(head) :] if full.startswith(head) else None
        found = None if after is None else _leading_special_token(self.tokenizer, after)
        if not tail.strip() and found is not None:
            return found[0], "", True
        raise TemplateError(
            "the chat template closes an assistant turn with "
            f"{tail[:40]!r}, which does not start with a special token; toolgym needs a special "
            "end-of-turn token to stop generation on"
        )

    def check_calls_fit_in_one_turn(self, end_of_turn: str, end_opens_next_turn: bool) -> None:
        """Refuse a template that writes its end-of-turn token before the tool calls of a turn
        (GigaChat 3: the text, then a separate `function call` part): generation would stop
        before the model wrote a call."""
        if end_opens_next_turn:
            return
        try:
            reply = self.probe(1).text
        except ValueError:
            return
        at = reply.find(end_of_turn)
        if at >= 0 and "get_weather" in reply[at:]:
            raise TemplateError(
                f"the chat template writes its end-of-turn token {end_of_turn!r} before the "
                f"tool call in an assistant turn ({reply[-200:]!r}); generation stops on that "
                "token, so the model could never write the call"
            )

    def next_turn_openers(self) -> set[str]:
        """Special tokens that open the turn after a final answer, for templates whose turns end
        where the next one opens (GLM: `<|user|>`)."""
        final = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE_CONTENT}]
        try:
            text = self.render([*final, {"role": "user", "content": "u2"}], PROBE_TOOLS)
        except Exception:
            return set()
        tail = text[text.rindex(_PROBE_CONTENT) + len(_PROBE_CONTENT) :]
        found = _leading_special_token(self.tokenizer, tail)
        return {found[0]} if found else set()

    def call_end(self, end_of_turn: str) -> str | None:
        """A special token other than the end-of-turn that closes a turn of tool calls, which
        generation must stop on too (Gemma 4's `<|tool_response>`, harmony's `<|call|>`): the
        last token of the template's tool-call turn, when it is not written between calls."""
        try:
            one, two = (self.probe(n).text.rstrip() for n in (1, 2))
        except ValueError:
            return None
        specials = sorted(self.tokenizer.all_special_tokens, key=len, reverse=True)
        last = next((token for token in specials if token and one.endswith(token)), None)
        if last is None or last == end_of_turn or last in _eos_tokens(self.tokenizer):
            return None
        if two.count(last) > 1:  # written between calls: part of the call syntax
            return None
        before: list[Message] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]},
        ]
        result = {"role": "tool", "name": "lookup", "tool_call_id": "call00001", "content": "v"}
        try:
            head = self.render(before, PROBE_TOOLS).rstrip()
            full = self.render([*before, result], PROBE_TOOLS, prompt=True)
        except Exception:
            return None
        # It must stay where it is once a tool result follows (not a next-turn opening that
        # the template writes only after a final message).
        return last if head.endswith(last) and full.startswith(head) else None


def _choose_per_turn(requested: bool | None, report: PrefixReport) -> bool:
    if requested is False and not report.prefix_preserving:
        raise TemplateError(
            "per_turn=False needs a prefix-preserving chat template, and this one is not:\n"
            f"{report.describe()}\nLeave per_turn unset to train it one sample per turn."
        )
    if requested is not None:
        return requested
    if not report.prefix_preserving:
        logger.info(
            "the chat template is not prefix-preserving for every shape of tool-call turn; "
            "episodes are built one sample per turn:\n%s",
            report.describe(),
        )
    return not report.prefix_preserving


def template_divergence(step: str, shorter: str, longer: str) -> str:
    """The error text for a rendering that rewrote earlier text at `step`."""
    return f"the chat template is not prefix-preserving: {divergence(step, shorter, longer)}"


def _needs_conversion(message: Message) -> bool:
    return _REASONING_KEYS[0] in message or message.get("tool_calls") == []


def _leading_special_token(tokenizer: Any, text: str) -> tuple[str, str] | None:
    """The special token `text` starts with (after whitespace), and what follows it."""
    stripped = text.lstrip()
    for token in sorted(tokenizer.all_special_tokens, key=len, reverse=True):
        if stripped.startswith(token):
            return token, stripped[len(token) :]
    return None


def _eos_tokens(tokenizer: Any) -> set[str]:
    eos = getattr(tokenizer, "eos_token", None)
    return {eos} if isinstance(eos, str) else set()
