"""Tool-call parsers for each model family, auto-detection, and robustness to any text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolgym import MalformedToolCall, ToolCall
from toolgym.agents.parsers import (
    PARSERS,
    ParsedMessage,
    detect_parser,
    get_parser,
    parse_hermes,
    parse_llama3,
    parse_mistral,
    parse_qwen3_coder,
)
from toolgym.testing import tiny_tokenizer


def calls(parsed: ParsedMessage) -> list:
    return [
        (c.name, c.arguments) if isinstance(c, ToolCall) else "malformed" for c in parsed.tool_calls
    ]


def test_hermes_several_calls_and_content():
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "guess", "arguments": "{\\"word\\": \\"crane\\"}"}</tool_call>'
    )
    parsed = parse_hermes(text)
    assert parsed.content == "Let me check."
    assert calls(parsed) == [("add", {"a": 1, "b": 2}), ("guess", '{"word": "crane"}')]


def test_hermes_broken_json_and_truncated_block_are_malformed():
    parsed = parse_hermes(
        '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call><tool_call>{"name"'
    )
    assert calls(parsed) == ["malformed", "malformed"]
    assert "invalid JSON" in parsed.tool_calls[0].reason
    assert parsed.failures == 2


def test_hermes_plain_answer_has_no_calls():
    assert parse_hermes("The answer is 42.") == ParsedMessage("The answer is 42.", [])


def test_llama3_json_calls():
    assert calls(parse_llama3('{"name": "add", "parameters": {"a": 1}}')) == [("add", {"a": 1})]
    text = (
        '<|python_tag|>{"name": "a", "parameters": {"s": "x;y"}}; {"name": "b", "parameters": {}}'
    )
    assert calls(parse_llama3(text)) == [("a", {"s": "x;y"}), ("b", {})]
    assert calls(parse_llama3("{oops} is how you write a set")) == []
    assert calls(parse_llama3('<|python_tag|>{"name": ')) == ["malformed"]


def test_mistral_both_formats():
    old = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "sub", "arguments": {}}]'
    assert calls(parse_mistral(old)) == [("add", {"a": 1}), ("sub", {})]
    new = '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]sub[ARGS]{}'
    assert calls(parse_mistral(new)) == [("add", {"a": 1}), ("sub", {})]
    assert calls(parse_mistral("[TOOL_CALLS][{broken")) == ["malformed"]
    assert calls(parse_mistral("no calls here")) == []


def test_qwen3_coder_xml():
    text = (
        "Sure.\n<tool_call>\n<function=search>\n<parameter=query>\nred shoes\n</parameter>\n"
        '<parameter=limit>\n5\n</parameter>\n<parameter=tags>\n["a", "b"]\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    parsed = parse_qwen3_coder(text)
    assert parsed.content == "Sure."
    assert calls(parsed) == [("search", {"query": "red shoes", "limit": 5, "tags": ["a", "b"]})]
    assert calls(parse_qwen3_coder("<tool_call><parameter=x>1</parameter></tool_call>")) == [
        "malformed"
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.builds(
            lambda name, args, cut: (
                f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'
                f"[TOOL_CALLS]{name}[ARGS]{args}<function={name}><parameter=x>{args}"
            )[:cut],
            st.text(max_size=10),
            st.text(max_size=20),
            st.integers(min_value=0, max_value=120),
        ),
    )
)
def test_no_parser_raises_on_random_or_truncated_text(text):
    for parser in PARSERS.values():
        parsed = parser(text)
        assert isinstance(parsed.content, str)
        assert all(isinstance(c, (ToolCall, MalformedToolCall)) for c in parsed.tool_calls)


def test_get_parser_by_name_callable_and_unknown():
    assert get_parser("hermes") is parse_hermes
    custom = lambda text: ParsedMessage(text)  # noqa: E731
    assert get_parser(custom) is custom
    with pytest.raises(ValueError, match="unknown parser 'nope'"):
        get_parser("nope")


QWEN3_CODER_LIKE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>\n<function={{ c.function.name }}>\n"
    "{%- for k, v in c.function.arguments.items() -%}"
    "<parameter={{ k }}>\n{{ v }}\n</parameter>\n{%- endfor -%}"
    "</function>\n</tool_call>{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
MISTRAL_LIKE = (
    "{%- for m in messages -%}{%- if m.role == 'user' -%}[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls -%}"
    "[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}</s>"
    "{%- else -%}{{ m.content }}</s>{%- endif -%}{%- endfor -%}"
)
LLAMA3_LIKE = (
    "{%- for m in messages -%}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{%- if m.tool_calls -%}{%- set f = m.tool_calls[0].function -%}"
    '{"name": "{{ f.name }}", "parameters": {{ f.arguments | tojson }}}'
    "{%- else -%}{{ m.content }}{%- endif -%}<|eot_id|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif -%}"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, parse_hermes),  # toolgym's own template
        (QWEN3_CODER_LIKE, parse_qwen3_coder),
        (MISTRAL_LIKE, parse_mistral),
        (LLAMA3_LIKE, parse_llama3),
    ],
)
def test_auto_detection_from_the_chat_template(template, expected):
    tokenizer = tiny_tokenizer()
    if template is not None:
        tokenizer.chat_template = template
    assert detect_parser(tokenizer) is expected
    assert get_parser("auto", tokenizer) is expected


def test_auto_detection_failure_says_what_the_template_rendered():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{%- for m in messages -%}{{ m.content }}{%- endfor -%}"
    with pytest.raises(ValueError, match="could not tell this chat template's tool-call format"):
        detect_parser(tokenizer)
