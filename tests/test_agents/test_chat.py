"""Chat rendering: stop tokens, tool suffixes, and the prefix-preservation check."""

from __future__ import annotations

import dataclasses

import pytest

from toolgym.agents import ChatRenderer, TemplateError
from toolgym.testing import tiny_tokenizer


def test_end_of_turn_and_stop_tokens():
    tokenizer = tiny_tokenizer()
    renderer = ChatRenderer(tokenizer)
    assert renderer.profile.end_of_turn == "<|im_end|>"
    assert renderer.profile.after_end_of_turn == "\n"
    assert renderer.profile.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_the_profile_is_learned_once_frozen_and_reused(monkeypatch):
    tokenizer = tiny_tokenizer()
    first = ChatRenderer(tokenizer)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.profile.per_turn = True  # type: ignore[misc]
    # A renderer given the profile never renders a probe: it only renders conversations.
    monkeypatch.setattr(
        "toolgym.agents.chat.profile_template",
        lambda *a, **k: pytest.fail("the template was profiled again"),
    )
    second = ChatRenderer(tokenizer, profile=first.profile)
    messages = [{"role": "user", "content": "hi"}]
    assert second.prompt_ids(messages) == first.prompt_ids(messages)
    tool = [{"role": "tool", "name": "f", "content": "42"}]
    assert second.tool_suffix_ids(tool) == first.tool_suffix_ids(tool)
    with pytest.raises(ValueError, match="agree with the profile"):
        ChatRenderer(tokenizer, per_turn=not first.profile.per_turn, profile=first.profile)
    with pytest.raises(ValueError, match="differs"):
        ChatRenderer(tokenizer, chat_template="{{ messages }}", profile=first.profile)


def test_tool_suffix_closes_the_turn_and_opens_the_next():
    tokenizer = tiny_tokenizer()
    renderer = ChatRenderer(tokenizer)
    suffix = renderer.tool_suffix_ids([{"role": "tool", "name": "f", "content": "42"}])
    assert tokenizer.decode(suffix) == (
        "\n<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


DROPS_EARLIER_REASONING = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and not loop.last -%}{{ m.content.split('</think>')[-1] }}"
    "{%- else -%}{{ m.content }}{%- endif -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def test_a_template_that_rewrites_earlier_turns_trains_one_sample_per_turn():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = DROPS_EARLIER_REASONING.replace("'</think>'", "'k'")
    renderer = ChatRenderer(tokenizer)
    assert renderer.profile.per_turn and not renderer.profile.prefix_report.prefix_preserving
    report = renderer.profile.prefix_report.describe()
    assert "a bare tool call: prefix-preserving" in report
    assert "text beside it: NOT prefix-preserving: adding the tool result changes" in report
    with pytest.raises(TemplateError, match="per_turn=False needs a prefix-preserving"):
        ChatRenderer(tokenizer, per_turn=False)
    assert not ChatRenderer(tiny_tokenizer()).profile.per_turn


def test_a_template_without_a_special_end_of_turn_is_refused():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{ m.role }}: {{ m.content }}\n{%- endfor -%}"
    )
    with pytest.raises(TemplateError, match="does not start with a special token"):
        ChatRenderer(tokenizer)
