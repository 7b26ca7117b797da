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


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_place():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = DROPS_EARLIER_REASONING.replace("'</think>'", "'k'")
    with pytest.raises(
        TemplateError, match=r"not prefix-preserving: adding a (tool|assistant) turn"
    ):
        ChatRenderer(tokenizer)


def test_a_template_without_a_special_end_of_turn_is_refused():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{ m.role }}: {{ m.content }}\n{%- endfor -%}"
    )
    with pytest.raises(TemplateError, match="does not start with a special token"):
        ChatRenderer(tokenizer)
