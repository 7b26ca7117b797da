"""Tools: a method's JSON schema, its argument checks, and how its result becomes text.

The schema comes from the type hints and the Google-style docstring through
`transformers.utils.get_json_schema` (the same parser chat templates rely on), with the
defaults added; `Args:` entries written `name (type): text` are read too (`docstrings`).
Arguments are checked and coerced by a pydantic model built from the same signature, so
`"42"` becomes `42` for an `int` parameter and a wrong or missing argument gives a message
the model can act on.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import types
import weakref
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_type_hints

from toolgym.envs.docstrings import with_plain_args
from toolgym.envs.hooks import (
    HOOK_NAMES,
    METHOD_HOOKS,
    RESERVED_NAMES,
    TRL_NOT_TOOLS,
)

if TYPE_CHECKING:
    import pydantic


class ToolSchemaError(TypeError):
    """A public method cannot be exposed as a tool (missing docstring, type hint, ...)."""


class ProtocolClashError(ToolSchemaError):
    """A plain class's public method has the name of a protocol hook: TRL would expose it as a
    tool, toolgym would call it with a meaning of its own (see `HOOK_NAMES`)."""


class ToolArgumentError(ValueError):
    """The arguments of a tool call do not match the tool's signature."""


@dataclass(frozen=True)
class Tool:
    """One tool: an (unbound) method with its schema and argument model."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    arguments_model: type[pydantic.BaseModel]
    ends_episode: bool = False
    """Marked with `ends_episode`: a successful call is the model's answer and ends the
    episode (status `finished`)."""
    strict: bool = False
    """Arguments reach the function as the model sent them (only their names are checked);
    see `strict_arguments`."""

    @property
    def signature(self) -> str:
        """The call signature as the model should write it, e.g. `guess(word: str)`."""
        params = self.schema["function"]["parameters"]
        required = set(params.get("required", []))
        parts = []
        for name, prop in params["properties"].items():
            text = f"{name}: {_type_label(prop)}"
            if name not in required:
                text += f" = {json.dumps(prop.get('default'))}"
            parts.append(text)
        return f"{self.name}({', '.join(parts)})"

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and coerce `arguments` (a strict tool: check their names only); raise
        ToolArgumentError with a readable reason."""
        if self.strict:
            return _names_checked(arguments, self.schema["function"]["parameters"])
        try:
            parsed = self.arguments_model.model_validate(arguments)
        except _pydantic().ValidationError as error:
            raise ToolArgumentError(_describe_validation_error(error)) from None
        except (ValueError, RecursionError) as error:  # an int past str()'s digits, deep lists
            raise ToolArgumentError(f"unreadable arguments ({type(error).__name__})") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}


@dataclass(frozen=True)
class SchemaTool(Tool):
    """A tool whose arguments its JSON Schema checks (a schema given with `tool_schema`, an
    MCP server's listing): numbers and booleans written as strings are read as their type,
    then every way they break the schema is named (a strict tool: their names only)."""

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        import jsonschema

        parameters = self.schema["function"]["parameters"]
        if self.strict:
            return _names_checked(arguments, parameters)
        arguments = _coerced(arguments, parameters.get("properties") or {})
        errors = sorted(
            jsonschema.Draft202012Validator(parameters).iter_errors(arguments),
            key=lambda e: list(e.path),
        )
        if errors:
            raise ToolArgumentError("; ".join(_describe_schema_error(e) for e in errors[:3]))
        return dict(arguments)


_SCHEMA = "__toolgym_schema__"


def tool_schema(schema: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a tool its JSON schema instead of reading its type hints and docstring: a decorator
    taking `{"description": ..., "parameters": {JSON Schema of an object}}` (OpenAI's
    `{"type": "function", "function": {...}}` too; a `name`, if given, must be the method's).
    The parameters must be the function's own (the schema may leave out those with defaults);
    arguments are checked against the schema (`SchemaTool`). For a suite that ships its
    functions' documentation apart from their code (BFCL's function docs)."""

    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        setattr(function, _SCHEMA, schema)
        return function

    return mark


def make_tool(
    function: Callable[..., Any], owner: str = "", trl_schema: bool = False, strict: bool = False
) -> Tool:
    """Build a Tool from a method or function; `owner` names its class in error messages.
    `trl_schema`: the schema exactly as TRL builds it (`get_json_schema`, its `return` kept,
    no defaults added), for classes written for TRL. `strict`: see `Tool.strict`. A schema
    given with `tool_schema` is used as it is."""
    qualified = f"{owner}.{function.__name__}" if owner else function.__name__
    parameters = _tool_parameters(function, qualified)
    given = getattr(function, _SCHEMA, None)
    if given is not None:
        return SchemaTool(
            name=function.__name__,
            function=function,
            schema=_given_schema(given, function, parameters, qualified),
            arguments_model=_pydantic().BaseModel,  # unused: the schema checks the arguments
            ends_episode=marked_ends_episode(function),
            strict=strict,
        )
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import (
        DocstringParsingException,
        TypeHintParsingException,
    )

    try:
        schema = get_json_schema(with_plain_args(function))
    except (DocstringParsingException, TypeHintParsingException) as error:
        raise ToolSchemaError(
            f"{qualified} is a public method, so toolgym exposes it as a tool, but its schema "
            f"cannot be built: {error}. Give it type hints and a Google-style docstring "
            f"(a summary line and an `Args:` entry per parameter: `name: text` or "
            f"`name (type): text`), or rename it "
            f"`_{function.__name__}` to keep it private."
        ) from None
    if not trl_schema:
        schema["function"].pop("return", None)
    properties = schema["function"]["parameters"]["properties"]
    for param in parameters if not trl_schema else ():
        if param.default is not inspect.Parameter.empty and _is_json(param.default):
            properties[param.name]["default"] = param.default
    return Tool(
        name=function.__name__,
        function=function,
        schema=schema,
        arguments_model=_arguments_model(function, parameters, qualified),
        ends_episode=marked_ends_episode(function),
        strict=strict,
    )


def strict_arguments(cls: type) -> bool:
    """Whether `cls`'s tools take arguments as sent (`Environment.strict_arguments`; a plain
    class, written for TRL, by default, as TRL passes them)."""
    return bool(getattr(cls, "strict_arguments", not is_environment_class(cls)))


def _names_checked(arguments: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """`arguments` as they are, if each required parameter is there and no other name."""
    known = parameters.get("properties") or {}
    problems = [
        f"missing required argument '{name}'"
        for name in parameters.get("required", [])
        if name not in arguments
    ]
    problems += [f"unexpected argument '{name}'" for name in arguments if name not in known]
    if problems:
        raise ToolArgumentError("; ".join(problems))
    return dict(arguments)


_ENDS_EPISODE = "__toolgym_ends_episode__"


def ends_episode(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a tool as the final answer: once a call of it succeeds (no error message), the
    episode ends with status `finished`, as when the model answers in plain text, and later
    calls get an "episode is over" error. Its result stays in the trajectory's messages; no
    tokens follow it (on sandboxes too: the mark travels with the class). Use it as a decorator
    (`@toolgym.ends_episode`) on a tool method, e.g. a `submit(answer)` that sets `reward`.
    """
    setattr(function, _ENDS_EPISODE, True)
    return function


def marked_ends_episode(function: Any) -> bool:
    """Whether `function` (a method, bound or not) is marked with `ends_episode`; standard
    library only, so a sandbox worker can ask without building the tool table."""
    return bool(getattr(function, _ENDS_EPISODE, False))


_HOOK = "__toolgym_hook__"


def hook(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a plain class's public method as toolgym's protocol hook of that name (`close`,
    `final_answer`, `episode_metrics`, `demonstration`, `inline_step`), not a tool. Without the
    mark such a method is refused (`ProtocolClashError`): TRL's `environment_factory` would
    show it to the model as a tool, and toolgym does not guess which meaning was meant.
    `toolgym.Environment` subclasses need no mark (their hooks are the base class's)."""
    setattr(function, _HOOK, True)
    return function


def public_methods(cls: type, exclude: Set[str]) -> dict[str, Callable[..., Any]]:
    """The plain functions defined on `cls` (and its bases) whose names make them tools."""
    methods: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__[:-1]):  # object last; subclasses override bases
        for name, value in vars(klass).items():
            if name.startswith("_") or name in exclude:
                methods.pop(name, None)
            elif inspect.isfunction(value):
                check_not_a_bare_function(klass, name, value)
                methods[name] = value
            elif isinstance(value, staticmethod) and getattr(cls, FUNCTION_TOOLS, False):
                methods[name] = value.__func__  # `function_tools`: plain functions as tools
            else:
                methods.pop(name, None)  # a property or attribute shadows an inherited method
    return methods


FUNCTION_TOOLS = "__toolgym_function_tools__"
"""Set on the class `toolgym.envs.functions.function_tools` makes: its static methods (the
user's plain functions) are its tools."""


def check_not_a_bare_function(owner: type, name: str, function: Callable[..., Any]) -> None:
    """Refuse a function defined outside the class and set on it as an attribute (`search =
    search_index`) whose first parameter is not `self`: Python would pass the instance as
    that parameter, and every call would fail with "got multiple values"."""
    defined_in = function.__qualname__.rsplit(".", 1)[0] if "." in function.__qualname__ else ""
    if defined_in == owner.__qualname__ or defined_in.endswith("<locals>"):
        return  # written in the class, or a method built in a function (bound onto it later)
    params = list(inspect.signature(function).parameters)
    if params and params[0] in ("self", "cls"):
        return
    raise ToolSchemaError(
        f"{owner.__name__}.{name} is the function {function.__module__}."
        f"{function.__qualname__} set as a class attribute; Python would pass the instance as "
        f"its first parameter ({params[0] if params else 'none'}), so no call could work. Pass "
        f"plain functions as a list (`toolgym.as_environment([{function.__name__}, ...])`), or "
        f"write a method `def {name}(self, ...)` that calls it."
    )


_tables: weakref.WeakKeyDictionary[type, tuple[tuple[int, ...], dict[str, Tool]]] = (
    weakref.WeakKeyDictionary()
)


def is_environment_class(cls: type) -> bool:
    """Whether `cls` subclasses `toolgym.Environment` (without importing it)."""
    return any(
        k.__name__ == "Environment" and k.__module__ == "toolgym.envs.core" for k in cls.__mro__
    )


def tool_table(cls: type) -> dict[str, Tool]:
    """The tools of an environment class by name, built once per class (on the host: a
    sandbox worker only runs calls the host checked), and again if the class changes (TRL's
    OpenReward adapter binds its tools onto the class in `__init__`). Every public method is
    a tool but the protocol's names (`RESERVED_NAMES`); ToolSchemaError names a method that
    cannot be one, ProtocolClashError a plain class's method that clashes with a hook."""
    fingerprint = tuple([len(klass.__dict__) for klass in cls.__mro__])
    cached = _tables.get(cls)
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    trl_schema = not is_environment_class(cls)  # written for TRL: its schemas, as TRL's
    strict = strict_arguments(cls)
    table = {
        name: make_tool(function, owner=cls.__name__, trl_schema=trl_schema, strict=strict)
        for name, function in tool_methods(cls).items()
    }
    _tables[cls] = (fingerprint, table)
    return table


def tool_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The functions of `cls` that are its tools (see `tool_table`)."""
    if is_environment_class(cls):
        return public_methods(cls, RESERVED_NAMES)
    methods = public_methods(cls, set(TRL_NOT_TOOLS))
    for name in [name for name in methods if name in HOOK_NAMES]:
        check_hook(cls, name, methods[name])
        del methods[name]
    return methods


def check_hook(owner: type, name: str, function: Any) -> None:
    """Refuse a plain class's method named like a protocol hook (see `HOOK_NAMES`), unless it
    is marked `@hook` (`inline_step`: or the class has `inline_markers`)."""
    if getattr(function, _HOOK, False) and name in METHOD_HOOKS:
        return
    if name == "inline_step" and hasattr(owner, "inline_markers"):
        return  # an inline-protocol class: the hook, not a tool (TRL has no inline protocol)
    if name in METHOD_HOOKS:
        ways = (
            f"rename it `_{name}` to keep it from the model (TRL's own adapters do), mark it "
            f"`@toolgym.hook` to make it toolgym's hook and not a tool, or give the tool "
            "another name"
        )
    else:
        ways = f"give the tool another name, or make `{name}` an attribute or a property"
    raise ProtocolClashError(
        f"{owner.__name__}.{name} is a public method, so TRL's environment_factory would "
        f"expose it to the model as a tool, but toolgym {HOOK_NAMES[name]}; toolgym does not "
        f"guess which was meant: {ways}."
    )


def own_methods(instance: object) -> dict[str, Any]:
    """The bound methods an instance holds itself under public names."""
    return {
        name: value
        for name, value in getattr(instance, "__dict__", _EMPTY).items()
        if type(value) is types.MethodType and not name.startswith("_")
    }


_EMPTY: dict[str, Any] = {}


def instance_tools(instance: object) -> dict[str, Tool]:
    """The tools of an instance: its class's (`tool_table`), and the bound methods it holds
    itself under public names (tools bound in `__init__`: `self.search = client.search`), as
    TRL finds them (`inspect.getmembers(instance, inspect.ismethod)`). Such a tool is named
    by its attribute (the name the model calls)."""
    cls = type(instance)
    table = tool_table(cls)
    own = own_methods(instance)
    if not own:
        return table
    environment = is_environment_class(cls)
    table = dict(table)
    for name, method in own.items():
        if name in (RESERVED_NAMES if environment else TRL_NOT_TOOLS):
            continue
        if not environment and name in HOOK_NAMES:
            check_hook(cls, name, method)
            continue
        tool = make_tool(
            method, owner=cls.__name__, trl_schema=not environment, strict=strict_arguments(cls)
        )
        if tool.name != name:
            tool.schema["function"]["name"] = name
            tool = dataclasses.replace(tool, name=name)
        table[name] = tool
    return table


class UnrenderableResult(TypeError):
    """A tool returned content the agent cannot show its model (audio; an image where the
    model or its template takes text only): the episode ends `env_error`, naming it, rather
    than the model reading an error."""


TEXT_BLOCK_TYPES = frozenset({"text", "input_text", "output_text"})
MEDIA_BLOCK_TYPES = frozenset({"image", "image_url", "input_image", "audio", "input_audio"})


def render_trl_result(value: Any) -> str:
    """A tool's return value as TRL 1.16 shows it to the model: `str(value)` (a list of text
    blocks as its texts, as for any class), valid Unicode."""
    if _is_content_blocks(value):
        return render_result(value)
    return _as_text(value)


def render_trl_error(message: str) -> str:
    """A failed call as TRL 1.16 shows it: `str({"error": message})`."""
    return valid_text(str({"error": message}))


def render_result(value: Any) -> str:
    """Tool return value -> message content: strings as they are, a list of content blocks
    (TRL's and MCP's `[{"type": "text", "text": ...}, ...]`) as its texts joined by newlines,
    everything else as JSON, or as `str()` shows it where it is not JSON (a `Decimal`, a set,
    a dataclass: as TRL and BFCL show results); either way valid Unicode (see `valid_text`). A
    block of media raises `UnrenderableResult` (tool calls and MCP results take images apart
    first: `image_blocks`); a value `str()` fails on raises TypeError."""
    if isinstance(value, str):
        return valid_text(value)
    if _is_content_blocks(value):
        media = [b["type"] for b in value if b["type"] in MEDIA_BLOCK_TYPES]
        if media:
            raise UnrenderableResult(
                f"the tool returned {media[0]!r} content: toolgym renders tool results as "
                "text for text-only chat templates (no image processor yet); return text, or "
                "describe the image in a text block"
            )
        return valid_text("\n".join(str(b.get("text", "")) for b in value))
    try:
        return valid_text(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return _as_text(value)  # not JSON


def _as_text(value: Any) -> str:
    """`str(value)` as valid Unicode; TypeError naming the type where `str()` fails."""
    try:
        text = str(value)
    except Exception as error:  # a result's own __str__ may raise anything
        raise TypeError(
            f"the tool returned a {type(value).__name__}, which is not JSON and cannot be "
            f"shown as text ({type(error).__name__}: {error}); return a string or JSON data"
        ) from None
    return valid_text(text)


IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})
MAX_IMAGE_BYTES = 8 * 2**20
"""The most encoded image bytes one tool result may carry (a sandbox's reply holds them)."""


def image_blocks(value: Any) -> list[dict[str, str]] | None:
    """A tool result of content blocks with at least one image (TRL's, MCP's and OpenAI's
    forms; the image a PIL image, bytes, a base64 string or a data URL) as text and image
    blocks in order, each image a `data:image/...;base64,` URL (JSON-safe, so sandboxes
    carry it); None for any other result. TypeError for an image it cannot read; audio
    raises `UnrenderableResult`. Standard library only (sandbox workers run it)."""
    if not _is_content_blocks(value) or not any(b["type"] in IMAGE_TYPES for b in value):
        return None
    blocks = []
    for block in value:
        kind = block["type"]
        if kind in TEXT_BLOCK_TYPES:
            blocks.append({"type": "text", "text": valid_text(str(block.get("text", "")))})
        elif kind in IMAGE_TYPES:
            blocks.append({"type": "image", "image": image_data_url(block)})
        else:
            raise UnrenderableResult(
                f"the tool returned {kind!r} content: toolgym renders text and images only"
            )
    if sum(len(b.get("image", "")) for b in blocks) > MAX_IMAGE_BYTES * 4 // 3:
        raise TypeError(f"a tool result's images are over {MAX_IMAGE_BYTES // 2**20} MiB")
    return blocks


def image_data_url(block: dict[str, Any]) -> str:
    """An image block's image as a base64 data URL."""
    import base64
    import io

    image = block.get("image", block.get("image_url", block.get("data")))
    if isinstance(image, dict):  # OpenAI's {"url": ...}
        image = image.get("url")
    if image is not None and hasattr(image, "save"):  # a PIL image
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        image = buffer.getvalue()
    if isinstance(image, bytes):
        mime = "image/jpeg" if image[:3] == b"\xff\xd8\xff" else "image/png"
        image = f"data:{mime};base64,{base64.b64encode(image).decode()}"
    elif isinstance(image, str) and not image.startswith("data:"):
        if image.startswith(("http://", "https://", "file:", "/")):
            raise TypeError("an image must be given inline (PIL image, bytes, base64), not a URL")
        mime = block.get("mimeType") or block.get("mime_type") or "image/png"
        image = f"data:{mime};base64,{image}"
    if not isinstance(image, str) or not image.startswith("data:image/") or "," not in image:
        raise TypeError(f"cannot read the image of a {block['type']!r} block")
    if len(image) > MAX_IMAGE_BYTES * 4 // 3:
        raise TypeError(f"a tool result's images are over {MAX_IMAGE_BYTES // 2**20} MiB")
    base64.b64decode(image.split(",", 1)[1], validate=True)  # binascii.Error: a ValueError
    return image


def checked_blocks(blocks: Any) -> list[dict[str, str]]:
    """Blocks from a sandbox's reply, checked as `image_blocks` makes them (the worker's
    process may have been taken over): ValueError for anything else."""
    if not isinstance(blocks, list) or not blocks:
        raise ValueError("a sandbox replied with content blocks that are not a list")
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        ok = (kind == "text" and isinstance(block.get("text"), str)) or (
            kind == "image"
            and isinstance(block.get("image"), str)
            and block["image"].startswith("data:image/")
            and len(block["image"]) <= MAX_IMAGE_BYTES * 4 // 3
        )
        if not ok or set(block) != {"type", kind}:
            raise ValueError(
                f"a sandbox replied with a content block toolgym never makes: {block!r:.80}"
            )
    return blocks


def blocks_text(blocks: list[dict[str, str]]) -> str:
    """The text of content blocks (their text blocks joined by newlines)."""
    return "\n".join(b["text"] for b in blocks if b["type"] == "text")


def _is_content_blocks(value: Any) -> bool:
    """Whether `value` is a non-empty list of typed content blocks (text or media)."""
    known = TEXT_BLOCK_TYPES | MEDIA_BLOCK_TYPES
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(b, dict) and b.get("type") in known for b in value)
    )


def valid_text(text: str) -> str:
    """`text` with lone surrogates (undecodable bytes, e.g. from `surrogateescape`) written as
    `\\udcff` escapes: a tokenizer, a chat template and a UTF-8 file all take the result."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


MAX_ARGUMENT_DEPTH = 32
"""Deepest nesting of lists and objects accepted in a call's arguments."""
MAX_ARGUMENT_SIZE = 1_000_000
"""Most characters (strings, keys) plus items accepted in a call's arguments."""


def decode_arguments(arguments: Any) -> dict[str, Any]:
    """Arguments as sent by a model (dict, JSON string, or None) -> dict; ToolArgumentError if
    not, or if they nest deeper than MAX_ARGUMENT_DEPTH or exceed MAX_ARGUMENT_SIZE."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        if len(arguments) > MAX_ARGUMENT_SIZE:
            raise ToolArgumentError(_too_large(len(arguments)))
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise ToolArgumentError(f"the arguments are not valid JSON ({error.msg})") from None
        except (ValueError, RecursionError) as error:
            raise ToolArgumentError(f"the arguments cannot be read ({error})") from None
    if not isinstance(arguments, dict):
        raise ToolArgumentError(
            f"the arguments must be a JSON object of named values, not {type(arguments).__name__}"
        )
    _check_shape(arguments)
    return arguments


def _check_shape(arguments: dict[str, Any]) -> None:
    """Depth and size limits, checked without recursion (a hostile value may nest deeply)."""
    size, stack = 0, [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            items = list(value.items())
            size += len(items) + sum(len(str(key)) for key, _ in items)
            children = [child for _, child in items]
        elif isinstance(value, (list, tuple)):
            size += len(value)
            children = list(value)
        else:
            size += len(value) if isinstance(value, str) else 1
            children = []
        if children and depth >= MAX_ARGUMENT_DEPTH:
            raise ToolArgumentError(
                f"the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels of lists and objects"
            )
        if size > MAX_ARGUMENT_SIZE:
            raise ToolArgumentError(_too_large(size))
        stack.extend((child, depth + 1) for child in children)


def _too_large(size: int) -> str:
    return f"the arguments are too large ({size} characters or more; at most {MAX_ARGUMENT_SIZE})"


def _given_schema(
    given: Any, function: Callable[..., Any], params: list[inspect.Parameter], qualified: str
) -> dict[str, Any]:
    """A schema given with `tool_schema`, in OpenAI's function form, checked against the
    function's signature and JSON Schema itself (ToolSchemaError naming what is wrong)."""
    import jsonschema

    body = given.get("function", given) if isinstance(given, dict) else None
    if not isinstance(body, dict):
        raise ToolSchemaError(f"{qualified}: tool_schema takes a dict, not {given!r:.60}")
    body = copy.deepcopy(body)
    name = body.setdefault("name", function.__name__)
    if name != function.__name__:
        raise ToolSchemaError(f"{qualified}: its given schema names another tool ({name!r})")
    body.setdefault("description", (inspect.getdoc(function) or "").split("\n\n")[0])
    parameters = body.setdefault("parameters", {"type": "object", "properties": {}})
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as error:
        raise ToolSchemaError(
            f"{qualified}: its given parameters are no JSON Schema: {error.message}"
        ) from None
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolSchemaError(f"{qualified}: its given parameters must be an object schema")
    properties = parameters.get("properties") or {}
    own = {param.name for param in params}
    problems = [f"it names {name!r}, which the function does not take" for name in properties]
    problems = [p for name, p in zip(properties, problems, strict=True) if name not in own]
    for param in params:
        if param.default is inspect.Parameter.empty and param.name not in properties:
            problems.append(f"it leaves out {param.name!r}, which has no default")
    if problems:
        raise ToolSchemaError(
            f"{qualified}: its given schema does not fit its signature: {'; '.join(problems)}"
        )
    return {"type": "function", "function": body}


def _coerced(arguments: dict[str, Any], properties: Any) -> dict[str, Any]:
    """Numbers and booleans the model wrote as strings, as their type (top level only)."""
    out = dict(arguments)
    for name, value in arguments.items():
        kind = (properties.get(name) or {}).get("type")
        if not isinstance(value, str):
            continue
        try:
            if kind == "integer":
                out[name] = int(value)
            elif kind == "number":
                out[name] = float(value)
            elif kind == "boolean" and value.lower() in ("true", "false"):
                out[name] = value.lower() == "true"
        except ValueError:
            pass  # left as written: the schema check names it
    return out


def _describe_schema_error(error: Any) -> str:
    where = ".".join(str(part) for part in error.path)
    return f"{where}: {error.message}" if where else error.message


def _tool_parameters(function: Callable[..., Any], qualified: str) -> list[inspect.Parameter]:
    params = list(inspect.signature(function).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    for param in params:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            stars = "*" if param.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            raise ToolSchemaError(
                f"{qualified} takes {stars}{param.name}; a tool needs named parameters with "
                f"type hints so that the model knows what to send. Rename it "
                f"`_{function.__name__}` if it is not meant to be a tool."
            )
    return params


def _arguments_model(
    function: Callable[..., Any], params: list[inspect.Parameter], qualified: str
) -> type[pydantic.BaseModel]:
    pydantic = _pydantic()
    hints = get_type_hints(function)
    fields: dict[str, Any] = {}
    for param in params:
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints[param.name], default)
    config = pydantic.ConfigDict(
        extra="forbid", coerce_numbers_to_str=True, arbitrary_types_allowed=True
    )
    try:
        return pydantic.create_model(f"{function.__name__}_arguments", __config__=config, **fields)
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError) as error:
        raise ToolSchemaError(f"{qualified}: cannot check its arguments: {error}") from None


def _pydantic() -> Any:
    # Imported on use: sandbox workers load this module without pydantic installed.
    import pydantic

    return pydantic


def _describe_validation_error(error: pydantic.ValidationError) -> str:
    problems = []
    for item in error.errors():
        name = ".".join(str(part) for part in item["loc"]) or "arguments"
        if item["type"] == "missing":
            problems.append(f"missing required argument '{name}'")
        elif item["type"] == "extra_forbidden":
            problems.append(f"unexpected argument '{name}'")
        else:
            problems.append(f"argument '{name}': {item['msg']} (got {_short_repr(item['input'])})")
    return "; ".join(problems)


def _short_repr(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except RecursionError:
        text = f"<a deeply nested {type(value).__name__}>"
    except ValueError:  # an int past str()'s digit limit
        text = f"<a {type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[:limit] + "..."


def _type_label(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(json.dumps(choice) for choice in prop["enum"])
    kind = prop.get("type", "any")
    if isinstance(kind, list):
        kind = " | ".join(kind)
    if kind == "array" and "items" in prop:
        kind = f"array[{_type_label(prop['items'])}]"
    return f"{kind} | null" if prop.get("nullable") else kind


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
