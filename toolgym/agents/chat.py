"""Chat template -> token ids, without ever re-tokenizing what the model wrote.

The prompt (with the environment's tool schemas) is rendered to ids once. After the model's
turn, the tool results are appended as the *suffix* ids the template produces after an
assistant turn: the rest of the assistant turn's closing markup, the tool turns, and the next
generation prompt. The model's own sampled ids are kept as they are.

At start-up `ChatRenderer` checks that the template is prefix-preserving for a tool round trip
(rendering a longer conversation only appends to a shorter one) and raises `TemplateError`
saying where it is not: templates that drop earlier reasoning (Qwen3-style `<think>` blocks)
fail this check; pass a training template that keeps them (`chat_template=...`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

Message = dict[str, Any]

_PROBE_TOOLS = [
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
_PROBE_CALL = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "k"}}}
_PROBE_CONTENT = "PROBE-CONTENT"


class TemplateError(ValueError):
    """The chat template cannot be used for exact-token multi-turn episodes."""


class ChatRenderer:
    """Renders conversations to ids for one tokenizer and chat template.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
        chat_template: A template to use instead of the tokenizer's own.
        template_kwargs: Extra template variables for every rendering (`enable_thinking`, ...).
    """

    def __init__(
        self, tokenizer: Any, chat_template: str | None = None, **template_kwargs: Any
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        # GRPO groups share prompts, and every tool turn shares its head: cache both.
        self._encode = functools.lru_cache(maxsize=1024)(_encoder(tokenizer))
        self._heads: dict[str, str] = {}
        self.end_of_turn, self.after_end_of_turn = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn)
        self.stop_token_ids = sorted({self.end_of_turn_id, *_eos_ids(tokenizer)})
        check_prefix_preserving(self)

    def render(
        self,
        messages: list[Message],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The ids of the conversation so far, ending with the assistant generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def tool_suffix_ids(
        self, tool_messages: list[Message], tools: list[dict] | None = None
    ) -> list[int]:
        """Ids to append after the model's end-of-turn token: tool turns + generation prompt."""
        before = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PROBE_CONTENT, "tool_calls": [_PROBE_CALL]},
        ]
        key = json.dumps(tools, sort_keys=True)
        if key not in self._heads:
            self._heads[key] = self.render(before, tools)
        head = self._heads[key]
        full = self.render(before + tool_messages, tools, add_generation_prompt=True)
        if not full.startswith(head):
            raise TemplateError(_divergence("adding tool results", head, full))
        return self.encode(self.after_end_of_turn + full[len(head) :])

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

    def _find_end_of_turn(self) -> tuple[str, str]:
        """The text that closes an assistant turn (e.g. `<|im_end|>`) and what follows it."""
        messages = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PROBE_CONTENT},
        ]
        text = self.render(messages)
        tail = text[text.rindex(_PROBE_CONTENT) + len(_PROBE_CONTENT) :]
        for token in sorted(self.tokenizer.all_special_tokens, key=len, reverse=True):
            if tail.startswith(token):
                return token, tail[len(token) :]
        raise TemplateError(
            "the chat template closes an assistant turn with "
            f"{tail[:40]!r}, which does not start with a special token; toolgym needs a special "
            "end-of-turn token to stop generation on"
        )

    def _single_token_id(self, token: str) -> int:
        ids = self.encode(token)
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


def check_prefix_preserving(renderer: ChatRenderer) -> None:
    """Raise TemplateError unless each step of a tool round trip only appends to the text."""
    conversation: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "thinking", "tool_calls": [_PROBE_CALL]},
        {"role": "tool", "name": "lookup", "content": "v"},
        {"role": "assistant", "content": "done"},
    ]
    for length in range(2, len(conversation)):
        shorter = renderer.render(
            conversation[:length],
            _PROBE_TOOLS,
            add_generation_prompt=conversation[length]["role"] == "assistant",
        )
        longer = renderer.render(conversation[: length + 1], _PROBE_TOOLS)
        if not longer.startswith(shorter):
            raise TemplateError(
                _divergence(f"adding a {conversation[length]['role']} turn", shorter, longer)
            )


def _divergence(step: str, shorter: str, longer: str) -> str:
    pairs = enumerate(zip(shorter, longer, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(shorter), len(longer)))
    window = slice(max(0, at - 60), at + 60)
    return (
        f"the chat template is not prefix-preserving: {step} changes earlier text at character "
        f"{at}: before {shorter[window]!r}, after {longer[window]!r}. "
        "Multi-turn training needs the conversation so far to stay unchanged; templates that drop "
        "earlier reasoning (Qwen3 <think>) need a training template that keeps it "
        "(chat_template=...)."
    )


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]
