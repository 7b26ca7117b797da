"""Tool-call parsers for each model family, auto-detection, and robustness to any text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolgym import MalformedToolCall, ToolCall
from toolgym.agents.parsers import (
    FORMATS,
    PARSERS,
    PLAIN_PARSERS,
    ParsedMessage,
    detect_format,
    detect_parser,
    get_parser,
    type_arguments,
)
from toolgym.testing import tiny_tokenizer

parse_hermes, parse_llama3 = PARSERS["hermes"], PARSERS["llama3"]
parse_mistral, parse_qwen3_coder = PARSERS["mistral"], PARSERS["qwen3_coder"]


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
    assert calls(parsed) == [("search", {"query": "red shoes", "limit": "5", "tags": '["a", "b"]'})]
    schema = {"limit": {"type": "integer"}, "tags": {"type": "array"}, "query": {"type": "string"}}
    typed = type_arguments(parsed, [_tool("search", schema)])
    assert calls(typed) == [("search", {"query": "red shoes", "limit": 5, "tags": ["a", "b"]})]
    assert calls(parse_qwen3_coder("<tool_call><function=f><parameter=x>1")) == ["malformed"]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_reads_its_own_example_and_reports_a_cut_call(name):
    fmt = FORMATS[name]
    parsed = type_arguments(PARSERS[name](fmt.example), [_tool("f", {"x": {"type": "integer"}})])
    assert [(c.name, c.arguments.get("x")) for c in parsed.tool_calls] == [("f", 1)]
    assert not parsed.failures
    for end in range(len(fmt.example)):  # cut by the token limit: malformed, absent, or whole
        cut = PARSERS[name](fmt.example[:end])
        valid = [(c.name, c.arguments) for c in cut.tool_calls if isinstance(c, ToolCall)]
        assert valid in ([], [("f", {"x": 1})], [("f", {"x": "1"})]), (end, cut)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.builds(
            lambda examples, noise, cut: (noise.join(examples))[:cut],
            st.lists(st.sampled_from([f.example for f in FORMATS.values()]), max_size=3),
            st.sampled_from(["", " ", "\n", "<", '"', "}", "]", "<|", "|>", "x"]),
            st.integers(min_value=0, max_value=300),
        ),
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
    """Every parser, built in or alias, on random text and on cut or mixed calls of every
    format."""
    for parser in PARSERS.values():
        parsed = parser(text)
        assert isinstance(parsed.content, str) and isinstance(parsed.reasoning, str)
        assert all(isinstance(c, (ToolCall, MalformedToolCall)) for c in parsed.tool_calls)


def test_several_calls_in_one_message_for_each_family():
    cases = {
        "pythonic": "<|tool_call_start|>[f(x=1), g(s='a b')]<|tool_call_end|>",
        "gemma4": "<|tool_call>call:f{x:1}<tool_call|>"
        '<|tool_call>call:g{s:<|"|>a b<|"|>}<tool_call|>',
        "glm": "<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
        "<tool_call>g<arg_key>s</arg_key><arg_value>a b</arg_value></tool_call>",
        "invoke": '<invoke name="f"><parameter name="x">1</parameter></invoke>'
        '<invoke name="g"><parameter name="s">a b</parameter></invoke>',
        "deepseek": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": 1}'
        '<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{"s": "a b"}<｜tool▁call▁end｜>',
        "kimi_k2": '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"x": 1}'
        "<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>"
        '{"s": "a b"}<|tool_call_end|>',
        "harmony": "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|call|>'
        '<|start|>assistant<|channel|>commentary to=functions.g<|message|>{"s": "a b"}',
    }
    tools = [_tool("f", {"x": {"type": "integer"}}), _tool("g", {"s": {"type": "string"}})]
    for name, text in cases.items():
        parsed = type_arguments(PARSERS[name](text), tools)
        assert calls(parsed) == [("f", {"x": 1}), ("g", {"s": "a b"})], name
    assert PARSERS["harmony"](cases["harmony"]).reasoning == "Two calls."


def test_arguments_typed_by_the_schema_and_left_alone_where_it_says_string():
    parsed = PARSERS["glm"](
        "<tool_call>f<arg_key>n</arg_key><arg_value>2</arg_value><arg_key>s</arg_key>"
        "<arg_value>2</arg_value><arg_key>b</arg_key><arg_value>true</arg_value>"
        '<arg_key>o</arg_key><arg_value>{"k": [1]}</arg_value><arg_key>bad</arg_key>'
        "<arg_value>two</arg_value></tool_call>"
    )
    schema = {
        "n": {"type": "integer"},
        "s": {"type": "string"},
        "b": {"type": "boolean"},
        "o": {"anyOf": [{"type": "object"}, {"type": "null"}]},
        "bad": {"type": "integer"},
    }
    typed = type_arguments(parsed, [_tool("f", schema)])
    assert calls(typed) == [("f", {"n": 2, "s": "2", "b": True, "o": {"k": [1]}, "bad": "two"})]
    assert calls(PARSERS["pythonic"]("[f(s='2', n=2)]")) == [("f", {"s": "2", "n": 2})]


def test_reasoning_is_split_from_content_and_calls():
    parsed = PARSERS["hermes"](
        'Let me think.\n</think>\n\nSure.<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    assert (parsed.reasoning, parsed.content, calls(parsed)) == (
        "Let me think.",
        "Sure.",
        [("f", {})],
    )
    parsed = PARSERS["xml_function"]("<think>a <tool_call> inside</think>no call")
    assert (parsed.reasoning, parsed.content, parsed.tool_calls) == (
        "a <tool_call> inside",
        "no call",
        [],
    )
    gemma = PARSERS["gemma4"]("<|channel>thought\nplan<channel|>Done.")
    assert (gemma.reasoning, gemma.content) == ("plan", "Done.")


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
        (None, "hermes"),  # toolgym's own template
        (QWEN3_CODER_LIKE, "xml_function"),
        (MISTRAL_LIKE, "mistral"),
        (LLAMA3_LIKE, "llama3"),
    ],
)
def test_auto_detection_from_the_chat_template(template, expected):
    tokenizer = tiny_tokenizer()
    if template is not None:
        tokenizer.chat_template = template
    assert detect_format(tokenizer) == expected
    # none of these templates writes </think>: the parser leaves a "</think>" in the text alone
    assert detect_parser(tokenizer) is PLAIN_PARSERS[expected]
    assert get_parser("auto", tokenizer) is PLAIN_PARSERS[expected]


def test_auto_detection_failure_says_what_the_template_rendered():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{%- for m in messages -%}{{ m.content }}{%- endfor -%}"
    with pytest.raises(ValueError, match="does not write tool calls"):
        detect_parser(tokenizer)
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{ m.content }}{%- for c in m.tool_calls or [] -%}"
        "CALL {{ c.function.name }} WITH {{ c.function.arguments | tojson }}"
        "{%- endfor -%}{%- endfor -%}"
    )
    with pytest.raises(
        ValueError, match=r"(?s)none of the parsers .*hermes.*CALL get_weather WITH"
    ):
        detect_parser(tokenizer)


def _tool(name: str, properties: dict) -> dict:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_the_readme_table_lists_every_format():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme.split("| parser | format |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(FORMATS)


def test_auto_prefers_the_tokenizers_own_response_template_when_it_reads_calls_back():
    tokenizer = tiny_tokenizer()  # toolgym's ChatML template: Hermes-style calls
    tokenizer.response_template = {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "tool_calls": {
                "open": "<tool_call>",
                "close_pattern": r"</tool_call>\s*",
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
        },
    }
    assert detect_format(tokenizer) == "tokenizer"
    parse = get_parser("auto", tokenizer)
    parsed = parse('Sure.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert calls(parsed) == [("f", {"x": 1})] and parsed.content == "Sure."
    tokenizer.response_template = {"fields": {}}  # reads nothing back: a built-in parser
    assert detect_format(tokenizer) == "hermes"


def test_the_think_split_applies_where_the_template_writes_think_blocks():
    from template_corpus import TEMPLATE_DIR, template_tokenizer

    prose = "The answer is 4. Note: the </think> tag closes reasoning."
    chatml = get_parser("hermes", tiny_tokenizer())  # toolgym's template: no <think>
    assert (chatml(prose).content, chatml(prose).reasoning) == (prose, "")
    qwen3 = get_parser("auto", template_tokenizer(TEMPLATE_DIR / "trl" / "qwen3.jinja"))
    parsed = qwen3("Plan.\n</think>\n\nThe answer is 4.")
    assert (parsed.reasoning, parsed.content) == ("Plan.", "The answer is 4.")
    # a </think> inside a call's arguments is the call's text, not the end of reasoning
    call = '<tool_call>{"name": "f", "arguments": {"text": "strip </think> tags"}}</tool_call>'
    assert calls(qwen3(call)) == [("f", {"text": "strip </think> tags"})]


HOSTILE = [
    "<tool_call>" + "[" * 5000 + "</tool_call>",  # nesting past the recursion limit
    '<tool_call>{"name": "f", "arguments": {"x": 1' + "0" * 5000 + "}}</tool_call>",  # 5000 digits
    "[TOOL_CALLS]" + "[" * 20000,
    "<|tool_call_start|>[" + "a." * 20000 + "f(x=1)]",
    "[f(x=" + "not " * 20000 + "1)]",
    "<|tool_call>call:f{" + "x:{" * 20000,
    "<|tools_prefix|>" + "[" * 20000,
    "to=functions.get_weather" * 2000,  # harmony headers with no message
    " to=functions.get_weather" * 2000,
    "\n" * 40000,  # a policy stuck on newlines, no </think>
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json" + " " * 40000,
    "<|tool_call_begin|>" + " " * 40000,
    "<tool_call>" * 5000,
    "<" * 40000,
    "<parameter=" * 5000,
    '<invoke name="' * 5000,
]


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_hostile_replies_end_in_a_reading_not_an_exception_or_a_hang(index):
    """What a policy optimised against the parser might write: every parser returns (a hang
    would fail on the suite's per-test timeout), and typing by a schema never raises."""
    text = HOSTILE[index]
    array = [_tool("f", {"x": {"type": "array"}, "n": {"type": ["integer", "null"]}})]
    for parser in PARSERS.values():
        parsed = type_arguments(parser(text), array)
        assert all(isinstance(c, (ToolCall, MalformedToolCall)) for c in parsed.tool_calls)
    deep = ToolCall("f", {"x": "[" * 5000, "n": "1" + "0" * 5000})
    typed = type_arguments(ParsedMessage("", [deep]), array)
    assert typed.tool_calls[0].arguments == {"x": "[" * 5000, "n": "1" + "0" * 5000}


def test_typing_survives_odd_schemas_and_keeps_text_that_is_not_json():
    parsed = ParsedMessage("", [ToolCall("f", {"a": "2", "b": "NaN", "c": "02134", "d": "7"})])
    tools = [
        {"type": "function", "function": {"name": "g", "parameters": None}},
        {"type": "function", "function": {"name": "h", "parameters": {"properties": {"x": True}}}},
        _tool(
            "f",
            {
                "a": {"enum": [1, 2, 3]},
                "b": {"type": "number"},
                "c": {"type": "integer"},
                "d": {"anyOf": "not a list"},
            },
        ),
    ]
    typed = type_arguments(parsed, tools)
    assert typed.tool_calls[0].arguments == {"a": 2, "b": "NaN", "c": "02134", "d": "7"}
    gemma = PARSERS["gemma4"]("<|tool_call>call:f{zip:02134,n:1_000,x:nan,y:-2.5e3}<tool_call|>")
    assert calls(gemma) == [("f", {"zip": "02134", "n": "1_000", "x": "nan", "y": -2500.0})]
    assert calls(PARSERS["pythonic"]("[f(x={1, 2})]")) == ["malformed"]  # a set is no argument
    model_id = '<tool_call>{"name": "f", "arguments": {}, "id": "x"}</tool_call>'
    assert PARSERS["hermes"](model_id).tool_calls[0].id is None  # ids are toolgym's to give


# -- formats from vLLM's example templates (issue 29) ---------------------------------------------
parse_json_calls = PARSERS["json_calls"]


def test_json_calls_reads_xlam_lists_llama4_objects_and_phi4_functools():
    one, two = '{"name": "f", "arguments": {"x": 1}}', '{"name": "g", "parameters": {"y": "a"}}'
    expected = [("f", {"x": 1}), ("g", {"y": "a"})]
    for text in (f"[{one}, {two}]", one + two, f"{one},\n{two}", f"{one}; {two}"):
        parsed = parse_json_calls(text)
        assert calls(parsed) == expected and parsed.content == "", text
    parsed = parse_json_calls(f"Let me look. functools[{one}, {two}]")
    assert calls(parsed) == expected and parsed.content == "Let me look."
    assert (
        PARSERS["xlam"] is PARSERS["phi4_mini_json"] is PARSERS["llama4_json"] is parse_json_calls
    )


def test_json_calls_reads_arguments_written_as_python_dicts():
    """phi-4-mini's and InternLM2's templates print the arguments dict with Jinja's str()."""
    text = """{"name": "f", "arguments": {'s': "it's", 'b': True, 'n': None}}"""
    assert calls(parse_json_calls(text)) == [("f", {"s": "it's", "b": True, "n": None})]
    sets = "functools[{'name': 'f', 'arguments': {'x': {2, 3}}}]"  # a set is no JSON value
    assert calls(parse_json_calls(sets)) == ["malformed"]


def test_json_calls_leaves_prose_alone_and_reports_what_it_cannot_read():
    for prose in ('{"a": 1} is a dict', "[1, 2]", "Hello {there}", "I used functools.partial"):
        assert parse_json_calls(prose) == ParsedMessage(prose.strip()), prose
    cut = parse_json_calls('[{"name": "f", "arguments": {"x": 1}}, {"name": "g", "argu')
    assert calls(cut) == [("f", {"x": 1}), "malformed"]
    trailing = parse_json_calls('{"name": "f", "arguments": {}} and then some text')
    assert calls(trailing) == [("f", {}), "malformed"]
    assert calls(parse_json_calls("functools[not json]")) == ["malformed"]


def test_internlm2_and_granite_20b_fc():
    text = (
        'Checking.<|action_start|><|plugin|>\n{"name": "f", "parameters": {"x": 1}}<|action_end|>'
        '<|action_start|><|plugin|>\n{"name": "g", "arguments": {\'y\': \'a\'}}<|action_end|>'
    )
    parsed = PARSERS["internlm2"](text)
    assert parsed.content == "Checking." and calls(parsed) == [("f", {"x": 1}), ("g", {"y": "a"})]
    assert calls(PARSERS["internlm2"]('<|action_start|><|plugin|>\n{"name"')) == ["malformed"]
    text = '<function_call> {"name": "f", "arguments": {"x": 1}}\n<function_call> {"name": "g"}'
    assert calls(PARSERS["granite_20b_fc"](text)) == [("f", {"x": 1}), ("g", {})]
    assert calls(PARSERS["granite-20b-fc"]("<function_call> {oops")) == ["malformed"]
    assert PARSERS["granite_20b_fc"]("no calls here").content == "no calls here"


def test_functiongemma_values_and_a_cut_call():
    text = (
        "Sure.<start_function_call>call:f{s:<escape>a, {b}<escape>,n:3,l:[1,2]}"
        "<end_function_call><start_function_call>call:g{}<end_function_call>"
    )
    parsed = PARSERS["functiongemma"](text)
    assert parsed.content == "Sure."
    assert calls(parsed) == [("f", {"s": "a, {b}", "n": 3, "l": [1, 2]}), ("g", {})]
    assert calls(PARSERS["functiongemma"]("<start_function_call>call:f{s:")) == ["malformed"]


def test_functionary_v32_recipients():
    text = 'get_weather\n{"city": "Paris"}>>>all\nChecking the time too.>>>get_time\n{}'
    parsed = PARSERS["functionary_v32"](text)
    assert calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert parsed.content == "Checking the time too."
    assert PARSERS["functionary_v32"]("all\nJust text.") == ParsedMessage("Just text.")
    assert PARSERS["functionary_v32"]("Plain prose, no recipient.").tool_calls == []
    assert calls(PARSERS["functionary_v32"]('f\n{"x": ')) == ["malformed"]


def test_pythonic_reads_olmo3s_calls_one_per_line():
    text = "Sure.<function_calls>\nf(s='a', b=true, n=null)\ng(l=[1, 2])\n</function_calls>"
    parsed = PARSERS["olmo3"](text)
    assert parsed.content == "Sure."
    assert calls(parsed) == [("f", {"s": "a", "b": True, "n": None}), ("g", {"l": [1, 2]})]
    assert calls(PARSERS["olmo3"]("<function_calls>\nx = 1\n</function_calls>")) == ["malformed"]
    assert calls(PARSERS["olmo3"]("<function_calls>\nf(a=")) == ["malformed"]


def test_pythonic_reads_llama4s_python_start_markers():
    text = 'Sure.<|python_start|>[f(x=1), g(y="a")]<|python_end|>'
    parsed = PARSERS["llama4_pythonic"](text)
    assert parsed.content == "Sure." and calls(parsed) == [("f", {"x": 1}), ("g", {"y": "a"})]


def test_auto_detection_failure_names_the_closest_parsers():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{ m.content }}{%- for c in m.tool_calls or [] -%}"
        '<tool_call>{"name": "{{ c.function.name }}", "args": {{ c.function.arguments | tojson }}}'
        "</tool_call>{%- endfor -%}{%- endfor -%}"
    )
    with pytest.raises(
        ValueError, match=r"(?s)closest: hermes read get_weather\(\{\}\).*<tool_call>"
    ):
        detect_format(tokenizer)
