"""Command-line flags and config files for a settings dataclass such as `GRPOConfig`.

`add_config_arguments(parser, GRPOConfig)` adds one flag per field, generated from the class
(as transformers' `HfArgumentParser` does): the type from the annotation (`X | None` also
takes `none`; `Literal` gives choices; `bool` gives `--flag` / `--no-flag`; a list or tuple
of scalars takes several values; anything else takes JSON), the default from the field and
the help from the string literal written under the field (or its `metadata["help"]`). The
fields of a nested dataclass such as `limits: AgentLimits` get flat flags (`--max-turns`),
dotted (`--limits.max-turns`) only where a name would clash.

`resolve_config(GRPOConfig, "run.yaml", args)` builds the instance with the precedence
field default < config file (YAML or JSON) < command-line flag. A file may write nested
fields as a mapping (`limits: {max_turns: 4}`), dotted (`limits.max_turns: 4`) or flat
(`max_turns: 4`); an unknown key is an error that names it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolgym.cli.errors import CLIError

DEST_PREFIX = "config."
"""Prefix of the argparse destinations of the generated flags (`config.limits.max_turns`)."""


@dataclass(frozen=True)
class ConfigField:
    """One settable value of a settings dataclass; a nested dataclass's fields are listed
    one by one, with their `path` through the nesting."""

    path: tuple[str, ...]
    hint: Any
    default: Any
    help: str

    @property
    def key(self) -> str:
        """The dotted path, e.g. `limits.max_turns`."""
        return ".".join(self.path)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation: the string literal under it in the class body (searched
    through the base classes too) or else its `metadata["help"]`."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's own text wins over its bases'
        if dataclasses.is_dataclass(klass):
            docs.update(_docstrings_in_body(klass))
    for item in dataclasses.fields(cls):
        if item.name not in docs and item.metadata.get("help"):
            docs[item.name] = str(item.metadata["help"])
    return docs


@functools.cache
def _docstrings_in_body(klass: type) -> dict[str, str]:
    """`name: type = value` followed by a string literal, in `klass`'s own source."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # no source (built in a REPL, frozen)
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    found = {}
    for current, following in itertools.pairwise(body):
        if (
            isinstance(current, ast.AnnAssign)
            and isinstance(current.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[current.target.id] = inspect.cleandoc(following.value.value)
    return found


def config_fields(cls: type) -> list[ConfigField]:
    """The settable values of `cls` in declaration order, nested dataclasses expanded."""
    return _fields_of(cls, (), None)


def _fields_of(cls: type, prefix: tuple[str, ...], defaults: Any) -> list[ConfigField]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    found = []
    for item in dataclasses.fields(cls):
        if not item.init:
            continue
        default = getattr(defaults, item.name) if defaults is not None else field_default(item)
        hint = hints[item.name]
        path = (*prefix, item.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            found += _fields_of(hint, path, default)
        else:
            found.append(ConfigField(path, hint, default, docs.get(item.name, "")))
    return found


def field_default(item: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its `default_factory`)."""
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None if item.default is dataclasses.MISSING else item.default


def flag_names(fields: list[ConfigField]) -> dict[str, str]:
    """Each field's flag name without `--`: the field's own name with `-` for `_`, prefixed by
    its dotted path where the short name would clash with another field's."""
    counts: dict[str, int] = {}
    for item in fields:
        counts[item.path[-1]] = counts.get(item.path[-1], 0) + 1
    names = {}
    for item in fields:
        short = item.path[-1] if counts[item.path[-1]] == 1 else item.key
        names[item.key] = short.replace("_", "-")
    return names


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of `cls` (see the module docstring); given flags land in the
    namespace as `config.<key>`, absent ones not at all (see `command_line_values`)."""
    fields = config_fields(cls)
    names = flag_names(fields)
    groups: dict[tuple[str, ...], Any] = {}
    for item in fields:
        group_path = item.path[:-1]
        if group_path not in groups:
            groups[group_path] = _argument_group(parser, cls, group_path)
        groups[group_path].add_argument(
            f"--{names[item.key]}",
            dest=DEST_PREFIX + item.key,
            default=argparse.SUPPRESS,
            help=_help_text(item),
            **argument_options(item.hint, item.path[-1]),
        )


def _argument_group(parser: argparse.ArgumentParser, cls: type, path: tuple[str, ...]) -> Any:
    """The help section of the top-level fields, or of one nested dataclass field."""
    if not path:
        return parser.add_argument_group(
            f"{cls.__name__} fields",
            "Precedence: field default < --config file < flag.",
        )
    owner = cls
    for name in path[:-1]:
        owner = typing.get_type_hints(owner)[name]
    nested = typing.get_type_hints(owner)[path[-1]]
    description = field_docs(owner).get(path[-1], "")
    return parser.add_argument_group(
        f"{'.'.join(path)} ({nested.__name__} fields)", description.replace("%", "%%")
    )


def _help_text(item: ConfigField) -> str:
    shown = item.default if isinstance(item.default, str) else repr(item.default)
    return f"{item.help} (default: {shown})".replace("%", "%%")


def argument_options(hint: Any, name: str = "value") -> dict[str, Any]:
    """The `add_argument` options (type, choices, nargs, action) for a field's annotation."""
    base, optional = without_none(hint)
    origin, args = typing.get_origin(base), typing.get_args(base)
    metavar = name.upper()
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        choices = [*args, *([None] if optional else [])]
        return {"type": scalar_type(type(args[0]), optional), "choices": choices}
    if base in (int, float, str):
        return {"type": scalar_type(base, optional), "metavar": metavar}
    if origin in (list, tuple) and args and args[0] in (int, float, str):
        if origin is tuple and Ellipsis not in args:  # exactly N words: never takes more
            return {"type": scalar_type(args[0], optional), "nargs": len(args), "metavar": metavar}
        # one comma-separated word: a list of words would swallow the ENV written after it
        return {"type": comma_list(args[0], optional), "metavar": f"{metavar}[,{metavar}...]"}
    return {"type": json_value, "metavar": "JSON"}


def without_none(hint: Any) -> tuple[Any, bool]:
    """(`X`, True) for `X | None` / `Optional[X]`; (`hint`, False) otherwise."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return hint, False


def scalar_type(kind: type, optional: bool) -> Callable[[str], Any]:
    """A converter of one command-line word to `kind` (`none` / `null` to None if optional);
    named after `kind` so that argparse's error says "invalid int value"."""

    def convert(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        return kind(text)

    convert.__name__ = kind.__name__
    return convert


def comma_list(kind: type, optional: bool) -> Callable[[str], Any]:
    """A converter of one command-line word of comma-separated values to a list of `kind`
    (`none` / `null` to None if optional; an empty word to an empty list)."""

    def convert(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        return [kind(part.strip()) for part in text.split(",")] if text.strip() else []

    convert.__name__ = f"comma-separated {kind.__name__}"
    return convert


def json_value(text: str) -> Any:
    """A command-line word parsed as JSON (for dict and other structured fields); `none` is
    None, as for the other optional flags."""
    if text.lower() == "none":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error.msg}): {text!r}") from None


def command_line_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields given as flags, by dotted key, converted to the annotated types."""
    values = {}
    for item in config_fields(cls):
        given = getattr(args, DEST_PREFIX + item.key, argparse.SUPPRESS)
        if given is not argparse.SUPPRESS:
            values[item.key] = coerce(given, item.hint, f"--{item.key}")
    return values


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a `.yaml` / `.yml` or `.json` file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise CLIError(f"config file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise CLIError(f"config file {str(path)!r}: expected a .yaml, .yml or .json file")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:  # json's errors are ValueErrors
        message = " ".join(str(error).split())
        raise CLIError(f"config file {str(path)!r} could not be read: {message}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CLIError(f"config file {str(path)!r}: expected a mapping of field names to values")
    return data


def file_values(cls: type, data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` (read from `source`) as values by dotted key; unknown keys are errors."""
    fields = {item.key: item for item in config_fields(cls)}
    aliases = {
        name.replace("-", "_"): key for key, name in flag_names(list(fields.values())).items()
    }
    groups = {".".join(item.path[:i]) for item in fields.values() for i in range(1, len(item.path))}
    values: dict[str, Any] = {}
    pending = [(str(name), value) for name, value in data.items()]
    while pending:
        name, value = pending.pop(0)
        key = name.replace("-", "_")
        key = key if key in fields or key in groups else aliases.get(key, key)
        if key in groups:
            if not isinstance(value, dict):
                raise CLIError(f"{source}: {name!r} must be a mapping of its fields")
            pending += [(f"{key}.{sub}", v) for sub, v in value.items()]
        elif key in fields:
            values[key] = coerce(value, fields[key].hint, f"{source}: {name}")
        else:
            raise CLIError(_unknown_key(cls, name, source, [*fields, *aliases]))
    return values


def _unknown_key(cls: type, name: str, source: str, known: list[str]) -> str:
    message = f"{source}: unknown key {name!r} ({cls.__name__} has no such field"
    close = difflib.get_close_matches(name.replace("-", "_"), known, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean {close[0]!r}?"
    return message + ")"


def coerce(value: Any, hint: Any, where: str) -> Any:
    """`value` (from a file or a flag) checked against, and converted to, the annotation;
    CLIError naming `where` when it does not fit."""
    base, optional = without_none(hint)
    if optional and isinstance(value, list | tuple) and list(value) == [None]:
        value = None  # `--reward-weights none`: the list flag's one word was `none`
    if value is None:
        if optional or base is Any:
            return None
        raise CLIError(f"{where}: a value is required (null given)")
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is Literal:
        if value not in args:
            raise CLIError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise CLIError(f"{where}: expected true or false, got {value!r}")
        return value
    if base in (int, float):
        return _number(value, base, where)
    if base is str:
        if not isinstance(value, str):
            raise CLIError(f"{where}: expected a string, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise CLIError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and Ellipsis not in args and len(value) != len(args):
            raise CLIError(f"{where}: expected {len(args)} values, got {len(value)}: {value!r}")
        element = args[0] if args else Any
        items = [coerce(v, element, where) for v in value]
        return tuple(items) if origin is tuple else items
    if (origin or base) is dict and not isinstance(value, dict):
        raise CLIError(f"{where}: expected a mapping, got {value!r}")
    return value


def _number(value: Any, kind: type, where: str) -> Any:
    """An int or float; YAML reads `1e-6` as a string, so numeric strings are accepted."""
    if isinstance(value, bool):
        raise CLIError(f"{where}: expected a number, got {value!r}")
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        raise CLIError(f"{where}: expected a number, got {value!r}") from None
    if not isinstance(number, int | float):
        raise CLIError(f"{where}: expected a number, got {value!r}")
    if kind is int:
        if isinstance(number, float) and not number.is_integer():
            raise CLIError(f"{where}: expected an integer, got {value!r}")
        return int(number)
    return float(number)


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """An instance of `cls` with `values` (by dotted key) over the field defaults."""
    top, nested = _split(values)
    for name, sub in nested.items():
        item = next(f for f in dataclasses.fields(cls) if f.name == name)
        top[name] = _replaced(field_default(item), sub)
    try:
        return cls(**top)
    except (TypeError, ValueError) as error:
        raise CLIError(f"{cls.__name__}: {error}") from None


def _replaced(instance: Any, values: dict[str, Any]) -> Any:
    top, nested = _split(values)
    for name, sub in nested.items():
        top[name] = _replaced(getattr(instance, name), sub)
    return dataclasses.replace(instance, **top)


def _split(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Top-level values, and the nested ones grouped by their first name."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    return top, nested


def resolve_config(cls: type, config_file: str | None, args: argparse.Namespace) -> Any:
    """`cls` built from its defaults, then `config_file` (if any), then the given flags."""
    values = {}
    if config_file:
        values.update(file_values(cls, read_config_file(config_file), config_file))
    values.update(command_line_values(args, cls))
    return build_config(cls, values)
