"""Chat template -> token ids, without ever re-tokenizing what the model wrote.

At start-up `ChatRenderer` learns what the template needs (arguments as JSON strings or
objects, a system turn or none) and checks, for each shape of turn a model writes, that the
template is prefix-preserving over a tool round trip (`template_check`). That decides how an
episode is built (`ChatRenderer.per_turn`):

- **one sequence** (prefix-preserving templates): the prompt is rendered to ids once; after each
  model turn the tool results are appended as the *suffix* ids the template writes after an
  assistant turn (its closing markup, the tool turns, the next generation prompt). The model's
  own sampled ids are kept as they are, and the whole episode is one training sequence.
- **a training template** (a recognised family whose own template is not prefix-preserving,
  Qwen3): toolgym's template for that family, which writes the same conversation but keeps
  earlier turns as they were, and the episode stays one sequence (`training_template`).
- **one sample per turn** (any other template): each turn's prompt is the template's own
  rendering of the conversation so far, as a server would feed it; each assistant turn is its
  own training sample (that prompt + the ids the model sampled), all sharing the episode's
  advantage. Exact for any template, at the cost of re-encoding the history each turn.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
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

_PROBE_CALL: dict[str, Any] = {
    "type": "function",
    "id": "call00001",
    "function": {"name": "lookup", "arguments": {"key": "k"}},
}
_PROBE_CONTENT = "PROBE-CONTENT"
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(ValueError):
    """The chat template cannot be used for multi-turn episodes."""


class ChatRenderer:
    """Renders conversations to ids for one tokenizer and chat template.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
        chat_template: A template to use instead of the tokenizer's own.
        per_turn: Build episodes one sample per turn (True), as one sequence (False, refused
            for templates that are not prefix-preserving), or as the template allows (None).
        training_templates: With `per_turn=None`, replace a recognised family's template that
            is not prefix-preserving by toolgym's training template for it (Qwen3), so that
            its episodes stay one sequence; `training_template` names the family used.
        template_kwargs: Extra template variables for every rendering (`enable_thinking`, ...).
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        per_turn: bool | None = None,
        training_templates: bool = True,
        **template_kwargs: Any,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        # GRPO groups share prompts, and every tool turn shares its head: cache both.
        self._encode = functools.lru_cache(maxsize=1024)(_encoder(tokenizer))
        self._heads: dict[str, str] = {}
        self._probes: dict[int, ProbeReply | ValueError] = {}
        self.string_arguments, system = self._learn_template_needs()
        self.end_of_turn, self.after_end_of_turn, self.end_opens_next_turn = (
            self._find_end_of_turn()
        )
        self.end_of_turn_id = _single_token_id(self, self.end_of_turn)
        self._check_calls_fit_in_one_turn()
        self.call_end = self._find_call_end()
        self.call_end_id = _single_token_id(self, self.call_end) if self.call_end else None
        stops = {self.end_of_turn_id, self.call_end_id, *_eos_ids(tokenizer)}
        if self.end_opens_next_turn:  # a final answer ends where the user's next turn opens
            stops |= {_single_token_id(self, t) for t in self._next_turn_openers()}
        self.stop_token_ids = sorted(stop for stop in stops if stop is not None)
        self.prefix_report: PrefixReport = self._check(system)
        self.training_template: str | None = None
        if per_turn is None and training_templates and not self.prefix_report.prefix_preserving:
            self._use_training_template(system)
        self.per_turn = self._choose_per_turn(per_turn)

    def render(
        self,
        messages: list[Message],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The conversation as the chat template writes it (text)."""
        return self.tokenizer.apply_chat_template(
            self.for_template(messages),
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
            **self.template_kwargs,
        )

    def for_template(self, messages: list[Message]) -> list[Message]:
        """Messages as this template reads them: reasoning under each key templates use,
        arguments as JSON strings where wanted, no empty `tool_calls`, images as blocks."""
        messages = [template_content(m) for m in messages]
        if not self.string_arguments and not any(_needs_conversion(m) for m in messages):
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
                if self.string_arguments and not isinstance(function.get("arguments"), str):
                    function["arguments"] = json.dumps(function.get("arguments", {}))
        return converted

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens added."""
        return list(self._encode(text))

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The ids of the conversation so far, ending with the assistant generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def tool_suffix_ids(
        self,
        tool_messages: list[Message],
        tools: list[dict] | None = None,
        after_call_end: bool = False,
    ) -> list[int]:
        """Ids to append after the model's end-of-turn token (or after `call_end`, where the
        model stopped on that): tool turns + generation prompt."""
        before: list[Message] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]},
        ]
        key = json.dumps(tools, sort_keys=True)
        if key not in self._heads:
            self._heads[key] = self.render(before, tools)
        head = self._heads[key]
        full = self.render(before + tool_messages, tools, add_generation_prompt=True)
        if not full.startswith(head):
            raise TemplateError(_divergence("adding tool results", head, full))
        if after_call_end and self.call_end and self.call_end in head:
            return self.encode(full[head.rindex(self.call_end) + len(self.call_end) :])
        suffix = full[len(head) :]
        if self.end_opens_next_turn:  # the model already wrote it, as its stop token
            suffix = suffix.lstrip().removeprefix(self.end_of_turn)
        return self.encode(self.after_end_of_turn + suffix)

    def assistant_ids(self, message: Message, tools: list[dict] | None = None) -> list[int]:
        """The ids of an assistant turn as the template writes it, through its end-of-turn
        token: what a model imitating `message` should generate (demonstrations for SFT)."""
        before = [{"role": "user", "content": "u"}]
        head = self.render(before, tools, add_generation_prompt=True)
        full = self.render([*before, message], tools)
        if not full.startswith(head):
            raise TemplateError(_divergence("adding an assistant turn", head, full))
        body = full[len(head) :]
        end = body.rindex(self.end_of_turn) + len(self.end_of_turn)
        return self.encode(body[:end])

    def _probe(self, calls: int) -> ProbeReply:
        """The template's assistant turn with `calls` probe calls, rendered once per renderer
        (several start-up checks read it); ValueError when the template cannot render it."""
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

    def _learn_template_needs(self) -> tuple[bool, bool]:
        """(arguments as JSON strings, a system turn is accepted), from a probe tool call."""
        kwargs = {"chat_template": self.chat_template, **self.template_kwargs}
        try:
            probe = self._probe(1)
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
                **kwargs,
            )
        except Exception:
            return probe.string_arguments, False
        return probe.string_arguments, True

    def _check(self, system: bool) -> PrefixReport:
        return check_prefix_preserving(
            lambda messages, prompt: self.render(messages, PROBE_TOOLS, prompt), system
        )

    def _use_training_template(self, system: bool) -> None:
        """Swap in toolgym's training template for a recognised family, if it passes."""
        own = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        found = training_template_for(own if isinstance(own, str) else None)
        if found is None:
            return
        family, template = found
        original, report = self.chat_template, self.prefix_report
        self.chat_template = template
        self.prefix_report = self._check(system)
        if not self.prefix_report.prefix_preserving:  # keep the original; train per turn
            self.chat_template, self.prefix_report = original, report
            return
        self.training_template = family
        self._probes.clear()  # they rendered the original template
        logger.info(
            "the %s chat template is not prefix-preserving:\n%s\nusing toolgym's %s training "
            "template instead (it keeps every turn's <think> block)",
            family,
            report.describe(),
            family,
        )

    def _choose_per_turn(self, requested: bool | None) -> bool:
        report = self.prefix_report
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

    def _find_end_of_turn(self) -> tuple[str, str, bool]:
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
            {"role": "assistant", "content": _PROBE_CONTENT, "tool_calls": [_PROBE_CALL]},
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

    def _check_calls_fit_in_one_turn(self) -> None:
        """Refuse a template that writes its end-of-turn token before the tool calls of a turn
        (GigaChat 3: the text, then a separate `function call` part): generation would stop
        before the model wrote a call."""
        if self.end_opens_next_turn:
            return
        try:
            reply = self._probe(1).text
        except ValueError:
            return
        at = reply.find(self.end_of_turn)
        if at >= 0 and "get_weather" in reply[at:]:
            raise TemplateError(
                f"the chat template writes its end-of-turn token {self.end_of_turn!r} before the "
                f"tool call in an assistant turn ({reply[-200:]!r}); generation stops on that "
                "token, so the model could never write the call"
            )

    def _next_turn_openers(self) -> set[str]:
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

    def _find_call_end(self) -> str | None:
        """A special token other than the end-of-turn that closes a turn of tool calls, which
        generation must stop on too (Gemma 4's `<|tool_response>`, harmony's `<|call|>`): the
        last token of the template's tool-call turn, when it is not written between calls."""
        if self.end_opens_next_turn:
            return None
        try:
            one, two = (self._probe(n).text.rstrip() for n in (1, 2))
        except ValueError:
            return None
        specials = sorted(self.tokenizer.all_special_tokens, key=len, reverse=True)
        last = next((token for token in specials if token and one.endswith(token)), None)
        if last is None or last == self.end_of_turn or last in _eos_tokens(self.tokenizer):
            return None
        if two.count(last) > 1:  # written between calls: part of the call syntax
            return None
        before: list[Message] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]},
        ]
        result = {"role": "tool", "name": "lookup", "tool_call_id": "call00001", "content": "v"}
        try:
            head = self.render(before, PROBE_TOOLS).rstrip()
            full = self.render([*before, result], PROBE_TOOLS, add_generation_prompt=True)
        except Exception:
            return None
        # It must stay where it is once a tool result follows (not a next-turn opening that
        # the template writes only after a final message).
        return last if head.endswith(last) and full.startswith(head) else None


def _needs_conversion(message: Message) -> bool:
    return _REASONING_KEYS[0] in message or message.get("tool_calls") == []


def _leading_special_token(tokenizer: Any, text: str) -> tuple[str, str] | None:
    """The special token `text` starts with (after whitespace), and what follows it."""
    stripped = text.lstrip()
    for token in sorted(tokenizer.all_special_tokens, key=len, reverse=True):
        if stripped.startswith(token):
            return token, stripped[len(token) :]
    return None


def _single_token_id(renderer: ChatRenderer, token: str) -> int:
    ids = renderer.encode(token)
    if len(ids) != 1:
        raise TemplateError(f"end-of-turn {token!r} is not a single token: {ids}")
    return ids[0]


def _encoder(tokenizer: Any) -> Any:
    """text -> tuple of ids without special tokens added; the Rust tokenizer directly when the
    tokenizer is a fast one (the same ids, without transformers' per-call overhead)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: tuple(backend.encode(text, add_special_tokens=False).ids)
    return lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))


def _divergence(step: str, shorter: str, longer: str) -> str:
    return f"the chat template is not prefix-preserving: {divergence(step, shorter, longer)}"


def _eos_tokens(tokenizer: Any) -> set[str]:
    eos = getattr(tokenizer, "eos_token", None)
    return {eos} if isinstance(eos, str) else set()


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]
