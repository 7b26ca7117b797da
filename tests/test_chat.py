"""Chat rendering: stop tokens, tool suffixes, and the prefix-preservation check."""

from __future__ import annotations

import pytest

from toolgym.agents import ChatRenderer, TemplateError
from toolgym.testing import tiny_tokenizer


def test_end_of_turn_and_stop_tokens():
    tokenizer = tiny_tokenizer()
    renderer = ChatRenderer(tokenizer)
    assert renderer.end_of_turn == "<|im_end|>"
    assert renderer.after_end_of_turn == "\n"
    assert renderer.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


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
    assert renderer.per_turn and not renderer.prefix_report.prefix_preserving
    report = renderer.prefix_report.describe()
    assert "a bare tool call: prefix-preserving" in report
    assert "text beside it: NOT prefix-preserving: adding the tool result changes" in report
    with pytest.raises(TemplateError, match="per_turn=False needs a prefix-preserving"):
        ChatRenderer(tokenizer, per_turn=False)
    assert not ChatRenderer(tiny_tokenizer()).per_turn


def test_a_template_without_a_special_end_of_turn_is_refused():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{ m.role }}: {{ m.content }}\n{%- endfor -%}"
    )
    with pytest.raises(TemplateError, match="does not start with a special token"):
        ChatRenderer(tokenizer)
