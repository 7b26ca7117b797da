"""Chat template -> token ids, without ever re-tokenizing what the model wrote.

At start-up `ChatRenderer` learns, once, what the template needs and does (`template_profile`:
arguments as JSON strings or objects, a system turn or none, its end-of-turn and stop tokens)
and checks, for each shape of turn a model writes, that the template is prefix-preserving over
a tool round trip (`template_check`). That decides how an episode is built
(`TemplateProfile.per_turn`):

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

import functools
import json
from typing import Any

from toolgym.agents.template_profile import (
    PROBE_CALL,
    TemplateError,
    TemplateProfile,
    messages_for_template,
    profile_template,
    render_conversation,
    template_divergence,
    token_encoder,
)

Message = dict[str, Any]

__all__ = ["ChatRenderer", "TemplateError", "TemplateProfile"]


class ChatRenderer:
    """Renders conversations to ids for one tokenizer and chat template.

    What the template needs and does is learned once, into `profile` (a frozen
    `TemplateProfile`: end-of-turn and stop tokens, argument form, the prefix verdict, one
    sequence or one sample per turn); rendering only reads it.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
        chat_template: A template to use instead of the tokenizer's own.
        per_turn: Build episodes one sample per turn (True), as one sequence (False, refused
            for templates that are not prefix-preserving), or as the template allows (None).
        training_templates: With `per_turn=None`, replace a recognised family's template that
            is not prefix-preserving by toolgym's training template for it (Qwen3), so that
            its episodes stay one sequence; `profile.training_template` names the family used.
        profile: A profile learned before for this tokenizer and these template variables
            (another renderer's `profile`), used instead of learning it again;
            `chat_template` and `per_turn` must then be unset or agree with it.
        template_kwargs: Extra template variables for every rendering (`enable_thinking`, ...).

    Raises:
        TemplateError: See `profile_template`.
        ValueError: `chat_template` or `per_turn` contradicts the `profile` given.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        per_turn: bool | None = None,
        training_templates: bool = True,
        *,
        profile: TemplateProfile | None = None,
        **template_kwargs: Any,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs
        if profile is None:
            profile = profile_template(
                tokenizer, chat_template, per_turn, training_templates, **template_kwargs
            )
        elif chat_template not in (None, profile.chat_template) or per_turn not in (
            None,
            profile.per_turn,
        ):
            raise ValueError(
                "ChatRenderer: chat_template and per_turn must be unset or agree with the "
                f"profile given (its per_turn is {profile.per_turn}, and its template "
                f"{'differs' if chat_template != profile.chat_template else 'agrees'})"
            )
        self.profile: TemplateProfile = profile
        # GRPO groups share prompts, and every tool turn shares its head: cache both.
        self._encode = functools.lru_cache(maxsize=1024)(token_encoder(tokenizer))
        self._heads: dict[str, str] = {}

    def render(
        self,
        messages: list[Message],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The conversation as the chat template writes it (text)."""
        return render_conversation(
            self.tokenizer,
            messages,
            tools,
            add_generation_prompt,
            chat_template=self.profile.chat_template,
            string_arguments=self.profile.string_arguments,
            template_kwargs=self.template_kwargs,
        )

    def for_template(self, messages: list[Message]) -> list[Message]:
        """Messages as this template reads them: reasoning under each key templates use,
        arguments as JSON strings where wanted, no empty `tool_calls`, images as blocks."""
        return messages_for_template(messages, self.profile.string_arguments)

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
            {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]},
        ]
        return self._suffix_ids(before, tool_messages, tools, after_call_end, "tool results")

    def user_turn_ids(
        self, user_message: Message, last_token: int | None, tools: list[dict] | None = None
    ) -> list[int] | None:
        """Ids to append after the model's answer without tool calls, which ended on
        `last_token`, when the user speaks again: the template's closing of the answer, the
        user turn and the next generation prompt. None where one sequence would not be what
        the template writes: the template writes an earlier turn differently once a user turn
        follows it (not prefix-preserving over a user turn), or the answer ended on a token
        other than the one the template closes it with (an end-of-text token). The next turn
        then needs a sample of its own, rendered from the whole conversation."""
        before: list[Message] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
        ]
        try:
            suffix = self._suffix_ids(before, [user_message], tools, False, "a user turn")
        except TemplateError:
            return None
        if suffix and suffix[0] == last_token:  # the model's stop token opened the user's turn
            return suffix[1:]
        if last_token == self.profile.end_of_turn_id and not self.profile.end_opens_next_turn:
            return suffix
        return None

    def _suffix_ids(
        self,
        before: list[Message],
        added: list[Message],
        tools: list[dict] | None,
        after_call_end: bool,
        what: str,
    ) -> list[int]:
        """What the template writes for `added` after `before` ends with the model's turn
        (through the next generation prompt), as ids to append after the model's own."""
        key = json.dumps([before, tools], sort_keys=True)
        if key not in self._heads:
            self._heads[key] = self.render(before, tools)
        head = self._heads[key]
        full = self.render(before + added, tools, add_generation_prompt=True)
        if not full.startswith(head):
            raise TemplateError(template_divergence(f"adding {what}", head, full))
        profile = self.profile
        call_end = profile.call_end
        if after_call_end and call_end and call_end in head:
            return self.encode(full[head.rindex(call_end) + len(call_end) :])
        suffix = full[len(head) :]
        if profile.end_opens_next_turn:  # the model already wrote it, as its stop token
            suffix = suffix.lstrip().removeprefix(profile.end_of_turn)
        return self.encode(profile.after_end_of_turn + suffix)

    def assistant_ids(self, message: Message, tools: list[dict] | None = None) -> list[int]:
        """The ids of an assistant turn as the template writes it, through its end-of-turn
        token: what a model imitating `message` should generate (demonstrations for SFT)."""
        before = [{"role": "user", "content": "u"}]
        head = self.render(before, tools, add_generation_prompt=True)
        full = self.render([*before, message], tools)
        if not full.startswith(head):
            raise TemplateError(template_divergence("adding an assistant turn", head, full))
        body = full[len(head) :]
        end = body.rindex(self.profile.end_of_turn) + len(self.profile.end_of_turn)
        return self.encode(body[:end])
