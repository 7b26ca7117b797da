"""The table of tool-call formats: each format's parser, the families that write it, and an
example; `PARSERS` maps every name and alias to its parser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolgym.agents.parsers.base import ParsedMessage, Parser, first_of, split_reasoning
from toolgym.agents.parsers.call_syntax import parse_functiongemma, parse_gemma4, parse_pythonic
from toolgym.agents.parsers.json_calls import (
    parse_functionary_v32,
    parse_granite_20b_fc,
    parse_internlm2,
    parse_json_calls,
)
from toolgym.agents.parsers.json_formats import (
    parse_apertus,
    parse_deepseek,
    parse_functionary,
    parse_harmony,
    parse_hermes,
    parse_kimi_k2,
    parse_llama3,
    parse_mistral,
    parse_solar,
    tagged_json,
)
from toolgym.agents.parsers.xml_formats import parse_glm, parse_invoke, parse_xml_function
from toolgym.envs.calls import MalformedToolCall


@dataclass(frozen=True)
class Format:
    """One tool-call format: its parser, the model families that write it, an example."""

    parser: Parser
    families: str
    example: str


FORMATS: dict[str, Format] = {
    "hermes": Format(
        parse_hermes,
        "Hermes 2/3, Qwen2.5, Qwen3 (to 2507), QwQ, Granite 4, MiMo, SmolLM2 (toolgym's template)",
        '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    ),
    "xml_function": Format(
        parse_xml_function,
        "Qwen3-Coder, Qwen3.5/3.6, Nemotron 3, Seed-OSS, StepFun 3.5",
        "<tool_call><function=f><parameter=x>1</parameter></function></tool_call>",
    ),
    "glm": Format(
        parse_glm,
        "GLM-4.5/4.6/4.7, Laguna, Ling 3, Spark, Hunyuan Hy3",
        "<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>",
    ),
    "invoke": Format(
        parse_invoke,
        "MiniMax-M2, DeepSeek V3.2/V4 (DSML), Muse Glimmer, MiniCPM5",
        '<invoke name="f"><parameter name="x">1</parameter></invoke>',
    ),
    "gemma4": Format(
        parse_gemma4, "Gemma 4, DiffusionGemma", '<|tool_call>call:f{x:1,s:<|"|>a<|"|>}<tool_call|>'
    ),
    "pythonic": Format(
        parse_pythonic,
        "LFM2 / LFM2.5, Llama 4 (also in `<|python_start|>`), OLMo 3 (`<function_calls>`, a call "
        "per line)",
        "<|tool_call_start|>[f(x=1)]<|tool_call_end|>",
    ),
    "llama3": Format(
        parse_llama3, "Llama 3.1 / 3.2 / 3.3", '{"name": "f", "parameters": {"x": 1}}'
    ),
    "mistral": Format(
        parse_mistral,
        "Mistral, Ministral 3, Devstral, Mistral Small 3.2",
        '[TOOL_CALLS]f[ARGS]{"x": 1}',
    ),
    "deepseek": Format(
        parse_deepseek,
        "DeepSeek V3, V3.1, R1 (tool-call blocks)",
        '<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜>',
    ),
    "kimi_k2": Format(
        parse_kimi_k2,
        "Kimi-K2 Instruct / Thinking",
        '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"x": 1}<|tool_call_end|>',
    ),
    "harmony": Format(
        parse_harmony,
        "gpt-oss",
        'to=functions.f<|channel|>commentary json<|message|>{"x": 1}<|call|>',
    ),
    "tool_calls_json": Format(
        tagged_json("<tool_calls>", "</tool_calls>"),
        "MiniMax-M1, Apriel",
        '<tool_calls>[{"name": "f", "arguments": {"x": 1}}]</tool_calls>',
    ),
    "nemotron_v2": Format(
        tagged_json("<TOOLCALL>", "</TOOLCALL>"),
        "Nemotron Nano v2",
        '<TOOLCALL>[{"name": "f", "arguments": {"x": 1}}]</TOOLCALL>',
    ),
    "granite": Format(
        tagged_json("<|tool_call|>", None),
        "Granite 3.x",
        '<|tool_call|>[{"name": "f", "arguments": {"x": 1}}]',
    ),
    "cohere": Format(
        tagged_json("<|START_ACTION|>", "<|END_ACTION|>", ("tool_name",)),
        "Command R7B, Command A",
        '<|START_ACTION|>[{"tool_name": "f", "parameters": {"x": 1}}]<|END_ACTION|>',
    ),
    "gigachat": Format(
        first_of(
            tagged_json("<|function_call|>", None),
            tagged_json("function call<|role_sep|>", "<|message_sep|>"),
        ),
        "GigaChat 3, 3.1",
        '<|function_call|>{"name": "f", "arguments": {"x": 1}}',
    ),
    "functionary": Format(parse_functionary, "Functionary v3.1", '<function=f>{"x": 1}</function>'),
    "apertus": Format(
        parse_apertus, "Apertus", '<|tools_prefix|>[{"f": {"x": 1}}]<|tools_suffix|>'
    ),
    "solar": Format(
        parse_solar,
        "Solar Open",
        '<|tool_call:begin|>id<|tool_call:name|>f<|tool_call:args|>{"x": 1}<|tool_call:end|>',
    ),
    "json_calls": Format(
        parse_json_calls,
        "xLAM (a JSON list), Llama 4 JSON (objects back to back), phi-4-mini (`functools[...]`)",
        '[{"name": "f", "arguments": {"x": 1}}]',
    ),
    "internlm2": Format(
        parse_internlm2,
        "InternLM2 / 2.5",
        '<|action_start|><|plugin|>{"name": "f", "parameters": {"x": 1}}<|action_end|>',
    ),
    "granite_20b_fc": Format(
        parse_granite_20b_fc,
        "Granite-20B-FunctionCalling",
        '<function_call> {"name": "f", "arguments": {"x": 1}}',
    ),
    "functionary_v32": Format(
        parse_functionary_v32, "Functionary v3.2", '>>>f\n{"x": 1}>>>all\ntext for the user'
    ),
    "functiongemma": Format(
        parse_functiongemma,
        "FunctionGemma",
        "<start_function_call>call:f{x:1,s:<escape>a<escape>}<end_function_call>",
    ),
}

_ALIASES = {
    "qwen3_coder": "xml_function",
    "qwen3_xml": "xml_function",
    "glm45": "glm",
    "minimax_m2": "invoke",
    "lfm2": "pythonic",
    "llama4": "pythonic",
    "deepseek_v3": "deepseek",
    "deepseek_v31": "deepseek",
    "gpt_oss": "harmony",
    "xlam": "json_calls",
    "llama4_json": "json_calls",
    "phi4_mini_json": "json_calls",
    "internlm": "internlm2",
    "granite-20b-fc": "granite_20b_fc",
    "llama4_pythonic": "pythonic",
    "olmo3": "pythonic",
}
_OWN_REASONING = {"harmony", "gemma4"}


# What reading text can raise (a backstop: the readers catch what they know of). Anything
# else comes from outside the text, and passes through: a caller's time limit (an alarm's
# TimeoutError or its own exception class), KeyboardInterrupt, a cancellation.
_READ_ERRORS = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    LookupError,
    MemoryError,
    RecursionError,
    TypeError,
    ValueError,
)


def _never_raises(parser: Parser) -> Parser:
    """A parser that turns what reading the text can raise into a malformed call."""

    def parse(text: str) -> ParsedMessage:
        try:
            return parser(text)
        except _READ_ERRORS as error:
            reason = f"unreadable tool call ({type(error).__name__})"
            return ParsedMessage(text.strip(), [MalformedToolCall(text, reason)])

    parse.__doc__, parse.__name__ = parser.__doc__, getattr(parser, "__name__", "parse")
    return parse


def _with_think_block(parser: Parser) -> Parser:
    def parse(text: str) -> ParsedMessage:
        reasoning, rest = split_reasoning(text)
        parsed = parser(rest)
        if reasoning:
            parsed.reasoning = "\n".join(r for r in (reasoning, parsed.reasoning) if r)
        return parsed

    parse.__doc__, parse.__name__ = parser.__doc__, getattr(parser, "__name__", "parse")
    return parse


PLAIN_PARSERS: dict[str, Parser] = {
    name: _never_raises(fmt.parser) for name, fmt in FORMATS.items()
}
"""Every name and alias -> its parser, without the `<think>` split: for templates that know no
`<think>` block (where a `</think>` in the text is the model's prose)."""
PARSERS: dict[str, Parser] = {
    name: parser if name in _OWN_REASONING else _never_raises(_with_think_block(parser))
    for name, parser in PLAIN_PARSERS.items()
}
"""Every name and alias -> its parser, a leading `<think>` block split off as reasoning."""
PARSERS.update({alias: PARSERS[target] for alias, target in _ALIASES.items()})
PLAIN_PARSERS.update({alias: PLAIN_PARSERS[target] for alias, target in _ALIASES.items()})


def parser_for_template(name: str, template: Any) -> Parser:
    """The parser `name`, with the `<think>` split where `template` writes `</think>`."""
    if isinstance(template, dict):  # named variants
        template = " ".join(str(t) for t in template.values())
    thinks = not isinstance(template, str) or "</think>" in template
    return PARSERS[name] if thinks else PLAIN_PARSERS[name]
