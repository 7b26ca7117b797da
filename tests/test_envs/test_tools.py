"""Tool schemas from type hints and docstrings, and the errors a tool author sees."""

from __future__ import annotations

from typing import Literal

import pytest

import toolgym
from toolgym import ToolCall
from toolgym.envs.tools import make_tool, tool_table


class Tricky(toolgym.Environment):
    def search(
        self,
        query: str,
        mode: Literal["fast", "exact"] = "fast",
        tags: list[str] | None = None,
        limit: int = 10,
        weights: dict[str, float] | None = None,
        strict: bool = False,
    ) -> str:
        """Search the catalogue.

        Args:
            query: What to look for.
            mode: How to match.
            tags: Only items with all of these tags.
            limit: Most results to return.
            weights: Per-field weights.
            strict: Fail instead of guessing.
        """
        return query

    def pick(self, colour: str) -> str:
        """Pick a colour.

        Args:
            colour: The colour to pick. (choices: ["red", "green"])
        """
        return colour

    def _helper(self) -> None:
        pass


def schema(name: str) -> dict:
    return next(
        t["function"]
        for t in toolgym.as_environment(Tricky()).tools
        if t["function"]["name"] == name
    )


def test_schema_in_openai_function_format():
    tools = toolgym.as_environment(Tricky()).tools
    assert {t["type"] for t in tools} == {"function"}
    assert sorted(t["function"]["name"] for t in tools) == ["pick", "search"]
    search = schema("search")
    assert search["description"] == "Search the catalogue."
    assert search["parameters"]["required"] == ["query"]


def test_schema_types_enums_optionals_lists_and_defaults():
    props = schema("search")["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert props["mode"]["default"] == "fast"
    assert props["tags"]["type"] == "array"
    assert props["tags"]["items"] == {"type": "string"}
    assert props["tags"]["nullable"] is True
    assert props["tags"]["default"] is None
    assert props["limit"] == {
        "type": "integer",
        "description": "Most results to return.",
        "default": 10,
    }
    assert props["weights"]["additionalProperties"] == {"type": "number"}
    assert props["strict"]["type"] == "boolean"


def test_choices_in_docstring_become_an_enum():
    props = schema("pick")["parameters"]["properties"]
    assert props["colour"]["enum"] == ["red", "green"]
    assert props["colour"]["description"] == "The colour to pick."


class Napoleon:
    """A plain class documented as Sphinx's napoleon (and BFCL's tool classes) write it."""

    def reset(self, **kwargs) -> None:
        pass

    def move(self, source: str, destination: str, overwrite: bool = False) -> str:
        """Move a file.

        Args:
            source (str): The file to move.
            destination (str): Where it goes; a folder keeps the name,
                as mv (1) does: see its manual (section 1).
            overwrite (bool, optional): Replace a file already there. Defaults to False.

        Returns:
            result (str): What happened.
        """
        return source

    def count(self, path: str, limit: int = 10) -> int:
        """Count the files under a folder.

        Parameters:
            path (Dict[str, int]): The folder.
            limit (int): Count at most this many. (choices: [10, 100])
        """
        return limit


class Plain:
    """The same tools with `name: text` entries."""

    def reset(self, **kwargs) -> None:
        pass

    def move(self, source: str, destination: str, overwrite: bool = False) -> str:
        """Move a file.

        Args:
            source: The file to move.
            destination: Where it goes; a folder keeps the name,
                as mv (1) does: see its manual (section 1).
            overwrite: Replace a file already there. Defaults to False.

        Returns:
            result (str): What happened.
        """
        return source

    def count(self, path: str, limit: int = 10) -> int:
        """Count the files under a folder.

        Args:
            path: The folder.
            limit: Count at most this many. (choices: [10, 100])
        """
        return limit


def test_typed_argument_entries_give_the_schema_of_plain_ones():
    """`name (type): text` and `name (type, optional): text` entries (and a `Parameters:`
    header) read as `name: text` would; a continuation line that looks like an entry stays
    text; the type and whether it is required come from the signature either way."""
    from transformers.utils import get_json_schema

    from toolgym.envs.docstrings import plain_args_docstring, with_plain_args

    for cls in (Napoleon, Plain, type("NapoleonEnv", (toolgym.Environment, Napoleon), {})):
        tools = {t["function"]["name"]: t["function"] for t in toolgym.as_environment(cls()).tools}
        move, count = tools["move"]["parameters"], tools["count"]["parameters"]
        assert move["required"] == ["source", "destination"], cls
        assert move["properties"]["destination"]["description"] == (
            "Where it goes; a folder keeps the name, as mv (1) does: see its manual (section 1)."
        )
        assert move["properties"]["overwrite"]["type"] == "boolean"
        assert count["properties"]["path"] == {"type": "string", "description": "The folder."}
        assert count["properties"]["limit"]["enum"] == [10, 100]
    assert tool_table(Napoleon)["move"].schema == tool_table(Plain)["move"].schema
    assert with_plain_args(Plain.move) is Plain.move  # nothing to rewrite: TRL's reading
    assert get_json_schema(with_plain_args(Napoleon.count)) == get_json_schema(Plain.count)
    doc = "Do.\n\nArgs:\n    x (int): An x.\n\nReturns:\n    y (int): A y."
    assert plain_args_docstring(doc) == "Do.\n\nArgs:\n    x: An x.\n\nReturns:\n    y (int): A y."


SCHEMA = {
    "description": "Move a file.",
    "parameters": {
        "type": "object",
        "properties": {
            "source": {"type": "string", "description": "The file."},
            "times": {"type": "integer", "minimum": 1},
        },
        "required": ["source"],
    },
}


class Given(toolgym.Environment):
    @toolgym.tool_schema(SCHEMA)
    def move(self, source, times=1):  # no type hints, no docstring: the schema says it all
        return f"{source} x{times}"


def test_a_given_schema_is_the_tools_schema_and_checks_its_arguments():
    env = toolgym.as_environment(Given())
    env.reset(seed=0)
    (tool,) = env.tools
    assert tool == {"type": "function", "function": {"name": "move", **SCHEMA}}
    assert env.step(ToolCall("move", {"source": "a", "times": "3"})).messages[0]["content"] == (
        "a x3"
    )
    bad = env.step(ToolCall("move", {"source": "a", "times": 0}))
    assert bad.results[0].failure == "invalid_arguments"
    assert "times: 0 is less than the minimum of 1" in bad.messages[0]["content"]
    strict = toolgym.as_environment(type("Strict", (Given,), {"strict_arguments": True})())
    strict.reset(seed=0)
    assert strict.step(ToolCall("move", {"source": 5})).messages[0]["content"] == "5 x1"
    assert (
        "unexpected argument 'to'"
        in strict.step(ToolCall("move", {"source": "a", "to": "b"})).messages[0]["content"]
    )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"name": "copy", **SCHEMA}, "names another tool"),
        ({"parameters": {"type": "array"}}, "must be an object schema"),
        ({"parameters": {"type": "object", "properties": {"x": {"type": 3}}}}, "no JSON Schema"),
        ({"parameters": {"type": "object", "properties": {}}}, "leaves out 'source'"),
        (
            {"parameters": {"type": "object", "properties": {"source": {}, "dest": {}}}},
            "names 'dest', which the function does not take",
        ),
    ],
)
def test_a_given_schema_that_does_not_fit_is_refused_naming_why(schema, message):
    class Wrong(toolgym.Environment):
        @toolgym.tool_schema(schema)
        def move(self, source, times=1):
            return source

    with pytest.raises(toolgym.ToolSchemaError, match=message):
        toolgym.as_environment(Wrong())


def test_private_methods_and_base_api_are_not_tools():
    names = {t["function"]["name"] for t in toolgym.as_environment(Tricky()).tools}
    assert "_helper" not in names
    for base_name in ("reset", "step", "astep", "close", "get_reward", "final_answer"):
        assert base_name not in names


def test_signature_is_readable():
    tool = tool_table(Tricky)["search"]
    assert tool.signature.startswith('search(query: string, mode: "fast" | "exact" = "fast"')
    assert "limit: integer = 10" in tool.signature


def test_missing_docstring_fails_at_first_use_naming_the_method():
    with pytest.raises(toolgym.ToolSchemaError, match=r"NoDoc\.act .*no docstring.*_act"):

        class NoDoc(toolgym.Environment):
            def act(self, x: int) -> str:
                return str(x)

        toolgym.as_environment(NoDoc())


def test_missing_argument_description_names_the_argument():
    with pytest.raises(toolgym.ToolSchemaError, match=r"Half\.act.*'y'"):

        class Half(toolgym.Environment):
            def act(self, x: int, y: int) -> str:
                """Act.

                Args:
                    x: An x.
                """
                return ""

        toolgym.as_environment(Half())


def test_missing_type_hint_is_an_error():
    with pytest.raises(toolgym.ToolSchemaError, match=r"type hint"):

        class Untyped(toolgym.Environment):
            def act(self, x) -> str:
                """Act.

                Args:
                    x: An x.
                """
                return ""

        toolgym.as_environment(Untyped())


def test_var_args_are_rejected():
    with pytest.raises(toolgym.ToolSchemaError, match=r"\*\*kwargs"):

        class Loose(toolgym.Environment):
            def act(self, **kwargs: int) -> str:
                """Act.

                Args:
                    kwargs: Anything.
                """
                return ""

        toolgym.as_environment(Loose())


def test_plain_class_errors_at_first_use():
    class Plain:
        def reset(self, **kwargs):
            return None

        def act(self, x: int) -> str:
            return str(x)

    with pytest.raises(toolgym.ToolSchemaError, match=r"Plain\.act"):
        toolgym.as_environment(Plain())


def test_validation_coerces_numbers_sent_as_strings():
    tool = make_tool(Tricky.search)
    args = tool.validate({"query": 5, "limit": "3", "strict": "true", "tags": ["a"]})
    assert args["limit"] == 3 and isinstance(args["limit"], int)
    assert args["query"] == "5"
    assert args["strict"] is True
    assert args["mode"] == "fast"
