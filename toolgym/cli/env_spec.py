"""What the ENV argument of `toolgym play / eval / train` names, and where its prompts come from.

`resolve_env(spec)` accepts

- a registered id: `Wordle-v0`, `myorg/Maze-v0`;
- a Python file and an attribute: `path/to/envs.py:Countdown` (the file is loaded as a module
  named after it, without being installed; its folder is put on `sys.path`, as `python
  path/to/envs.py` does, so that it can import the modules beside it);
- a module and an attribute: `mypackage.envs:Countdown` (the current folder is searched too,
  as `python -m` does).

The attribute is an environment class (an `Environment` subclass, or any class with `reset`
and public methods) or a factory returning an instance. `read_rows(path)` reads a JSONL file
of prompt rows, for environments without a registered dataset builder.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import os
import sys
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import toolgym
from toolgym.cli.errors import CLIError
from toolgym.registry import EnvSpec, UnknownEnvironmentError, parse_env_id


@dataclass(frozen=True)
class ResolvedEnv:
    """An environment named on the command line.

    Attributes:
        spec: The ENV argument as given.
        target: What `GRPOTrainer` accepts as `env`: the registered id, the class, or the
            factory.
        registered: The registry's entry for the id, or for the class when a registered id
            has it as entry point (its dataset builder is then used); None otherwise.
    """

    spec: str
    target: str | type | Callable[..., Any]
    registered: EnvSpec | None = None

    def make(
        self,
        sandbox: str | None = None,
        row: dict[str, Any] | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """A fresh instance (in `sandbox` for an id or a class: "local", "process", ...); an
        id registered `per_row` is built from `row` and `seed`."""
        if sandbox not in (None, "local") and not isinstance(self.target, str | type):
            raise CLIError(f"{self.spec}: --sandbox {sandbox} needs an environment class")
        if self.registered is not None and self.registered.per_row:
            if sandbox not in (None, "local"):
                raise CLIError(f"{self.spec}: built per row, in this process only")
            if row is None:
                raise CLIError(f"{self.spec}: its environment is built from each row; no row here")
            return self.registered.make_for(row, seed, **kwargs)
        return toolgym.env_factory(self.target, kwargs, sandbox)()

    def trainer_env(self, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
        """(`env`, `env_kwargs`) for `GRPOTrainer`: a factory gets its arguments bound."""
        if callable(self.target) and not isinstance(self.target, type | str) and kwargs:
            factory, bound = self.target, dict(kwargs)
            return (lambda: factory(**bound)), None
        return self.target, kwargs or None

    def dataset(self, n: int, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
        """`n` prompt rows from the registered dataset builder; CLIError when there is none."""
        if self.registered is None or self.registered.dataset_builder is None:
            raise CLIError(
                f"{self.spec} has no registered prompt dataset: pass --dataset FILE.jsonl "
                "(one JSON object per line with a 'prompt' (a string or chat messages) and "
                "the reset() arguments)"
            )
        try:
            rows = self.registered.dataset(n, seed=seed, **kwargs)
        except TypeError as error:  # e.g. --split for a builder without splits
            raise CLIError(f"{self.spec}: its dataset builder failed: {error}") from None
        return [dict(row) for row in rows]


def resolve_env(spec: str) -> ResolvedEnv:
    """The environment `spec` names: a registered id, `path/to/file.py:Attr` or `module:Attr`
    (see the module docstring); CLIError with a one-line reason when it names none."""
    if ":" not in spec:
        return _registered_id(spec)
    location, _, attribute = spec.rpartition(":")
    if not location or not attribute:
        raise CLIError(f"{spec!r}: expected an id, 'path/to/file.py:Class' or 'module:Class'")
    if location.endswith(".py") or "/" in location or os.sep in location:
        module = load_file(location)
    else:
        module = _import(location)
    target = _attribute(module, attribute, spec)
    _check_environment(target, spec)
    return ResolvedEnv(spec, target, _registration_of(target))


def import_registrations(location: str) -> ModuleType:
    """Run a Python file (`path/to/envs.py`) or import a module (`my_package.envs`), so that
    the ids its `toolgym.register(...)` calls register can be named (`toolgym --import`)."""
    if location.endswith(".py") or "/" in location or os.sep in location:
        return load_file(location)
    return _import(location)


def _registered_id(env_id: str) -> ResolvedEnv:
    try:
        parse_env_id(env_id)
        registered = toolgym.spec(env_id)
    except UnknownEnvironmentError as error:
        raise CLIError(
            f"{error} An environment in a file: 'path/to/file.py:Class'; ids a file registers: "
            "toolgym --import path/to/file.py COMMAND ..."
        ) from None
    except ValueError as error:  # a malformed id
        raise CLIError(f"{error}, or 'path/to/file.py:Class', or 'module:Class'") from None
    return ResolvedEnv(env_id, env_id, registered)


def load_file(location: str) -> ModuleType:
    """The Python file at `location`, executed as a module named after the file (so that a
    process sandbox's worker can import it by that name) unless that name is taken."""
    path = Path(location).expanduser().resolve()
    if not path.is_file():
        raise CLIError(f"{location!r}: no such file")
    fallback = f"toolgym_env_{zlib.crc32(str(path).encode()):08x}"
    name = path.stem if path.stem.isidentifier() else fallback
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded  # loaded before (e.g. by an earlier command in this process)
    if loaded is not None:  # the name is another module's: a worker cannot import this one
        name = fallback
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CLIError(f"{location!r}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its sibling modules, as `python file.py` has
    sys.modules[name] = module  # dataclasses, pickling and sandboxes look modules up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise CLIError(f"{location!r} failed to load: {_where(error, path)}") from None
    return module


def _import(module_name: str) -> ModuleType:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: modules of the current folder
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise CLIError(
                f"no module named {error.name!r} (not installed, and not in the current "
                "folder); for a file write 'path/to/file.py:Class'"
            ) from None
        raise CLIError(f"module {module_name!r} failed to import: {error}") from None
    except Exception as error:
        raise CLIError(f"module {module_name!r} failed to import: {_where(error)}") from None


def _where(error: BaseException, path: Path | None = None) -> str:
    """`ErrorType: message`, with the line of `path` (or the innermost line) it came from."""
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if path is None or Path(f.filename) == path]
    line = f" (line {mine[-1].lineno})" if mine else ""
    return f"{type(error).__name__}: {error}{line}"


def _attribute(module: ModuleType, attribute: str, spec: str) -> Any:
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            candidates = _environments_in(module)
            hint = difflib.get_close_matches(part, candidates, n=1)
            known = f"; did you mean {hint[0]!r}?" if hint else ""
            if not hint and candidates:
                known = f"; environments there: {', '.join(candidates)}"
            raise CLIError(f"{spec!r}: {module.__name__} has no attribute {part!r}{known}")
        target = getattr(target, part)
    return target


def _environments_in(module: ModuleType) -> list[str]:
    """Names of the classes in `module` that look like environments (they have `reset`)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type) and callable(getattr(value, "reset", None))
    )


def _check_environment(target: Any, spec: str) -> None:
    """An environment class (with `reset`) or a factory; CLIError for anything else."""
    if isinstance(target, type):
        if not callable(getattr(target, "reset", None)):
            raise CLIError(
                f"{spec!r}: class {target.__name__} is not an environment (no reset() method; "
                "subclass toolgym.Environment)"
            )
        return
    if isinstance(target, ModuleType) or not callable(target):
        raise CLIError(
            f"{spec!r} is a {type(target).__name__}, not an environment class or a factory "
            "returning an environment"
        )


def _registration_of(target: Any) -> EnvSpec | None:
    """The registered spec whose entry point is `target` (one with a dataset builder first)."""
    name = f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}"
    found = [
        toolgym.spec(env_id)
        for env_id in toolgym.list_envs()
        if toolgym.spec(env_id).entry_point is target or toolgym.spec(env_id).entry_point == name
    ]
    found.sort(key=lambda spec: spec.dataset_builder is None)
    return found[0] if found else None


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The prompt rows of a JSONL file: one object per line, each with a `prompt` (a string,
    or chat messages: a list of `{"role": ..., "content": ...}`) and the `reset` arguments.

    Lines end at `\n` only (a trailing `\r` is dropped): U+2028, U+2029 and `\x85` are text
    inside a row, as JSON allows. A line that is not UTF-8, not JSON, nested past what Python
    can decode, or holding an integer past Python's digit limit is a `CLIError` naming the
    file and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"dataset {str(path)!r} does not exist")
    rows = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        line = _decoded_line(raw.removesuffix(b"\r"), f"{path}, line {number}")
        if not line.strip():
            continue
        row = _json_row(line, f"{path}, line {number}")
        if not isinstance(row, dict) or not _is_prompt(row.get("prompt")):
            raise CLIError(
                f"{path}, line {number}: expected an object with a 'prompt' (a string or a list "
                "of chat messages with 'role' and 'content')"
            )
        rows.append(row)
    if not rows:
        raise CLIError(f"dataset {str(path)!r} has no rows")
    return rows


def _decoded_line(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CLIError(
            f"{where}: not UTF-8 (byte {raw[error.start]:#04x} at byte {error.start + 1} of the "
            "line)"
        ) from None


def _json_row(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise CLIError(f"{where}: not JSON ({error.msg})") from None
    except RecursionError:
        raise CLIError(f"{where}: JSON nested too deeply to read") from None
    except MemoryError:
        raise CLIError(f"{where}: too large to read") from None
    except ValueError:  # the only other: an integer past Python's digit limit
        limit = getattr(sys, "get_int_max_str_digits", None)
        digits = f"{limit()} digits" if limit else "Python's digit limit"
        raise CLIError(f"{where}: an integer longer than {digits}") from None


def _is_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )
