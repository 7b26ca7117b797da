"""Environments by name: `register`, `make`, `spec`, `list_envs`, and third-party entry points.

Ids look like `Wordle-v0` or, with a namespace, `myorg/Wordle-v0`. Once `toolgym.gym` is
imported, every registered id is also a gymnasium id: `gymnasium.make("toolgym/Wordle-v0")`
(gymnasium's own id grammar allows one `/`, so `myorg/Wordle-v0` becomes
`toolgym/myorg.Wordle-v0`); `gymnasium.make("toolgym.gym:toolgym/Wordle-v0")` imports it.

Third-party packages declare entry points in the group `toolgym.envs`, read the first time the
registry misses an id or lists ids:

    [project.entry-points."toolgym.envs"]
    "myorg/Maze-v0" = "myorg.maze:MazeEnv"      # an id: registered without importing anything
    myorg = "myorg.envs:register_all"           # not an id: a function that calls register()
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolgym.envs.stepping import Stepper, as_environment
from toolgym.envs.tools import tool_table
from toolgym.sandbox import sandboxed

if TYPE_CHECKING:
    import datasets

ENTRY_POINT_GROUP = "toolgym.envs"
_ID_PATTERN = re.compile(r"^(?:(?P<namespace>[\w-]+)/)?(?P<name>[\w.-]+?)(?:-v(?P<version>\d+))?$")

LAZY_NAMESPACES = {
    "reasoning-gym": "toolgym.builtin_envs.reasoning_gym:register_tasks",
    "bfcl": "toolgym.adapters.bfcl:register_categories",
    "textarena": "toolgym.adapters.textarena:register_games",
}
"""Namespaces of an optional package's tasks, registered while none of their ids is, the first
time one is asked for or ids are listed (so `import toolgym` does not import the package): the
hook is called with `register`, and raises ImportError naming the extra when the package is
missing (`spec` lets it through, listing skips the namespace)."""

EntryPoint = type | Callable[..., Any] | str
DatasetBuilder = Callable[..., "datasets.Dataset | list[dict[str, Any]]"]


class UnknownEnvironmentError(KeyError):
    """No environment is registered under the requested id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class EnvSpec:
    """How to build one registered environment and its prompt dataset.

    Attributes:
        id: The registered id, e.g. `Wordle-v0` or `myorg/Wordle-v0`.
        entry_point: The environment class, a factory returning an instance, or `"module:attr"`.
        kwargs: Default constructor arguments; `make(id, **overrides)` overrides them.
        dataset_builder: `f(n, seed, **kwargs)` returning a `datasets.Dataset` (or list of rows)
            with a `prompt` column (chat messages) and the `reset` keyword arguments.
        description: One line shown by `toolgym envs`.
        sandbox: Where `make` puts an instance unless told otherwise: "local" (in this
            process), "process", "docker", or "auto" (the strongest available).
        per_row: The entry point builds each episode's environment from its row,
            `entry_point(row, seed, **kwargs)` (its tools depend on the row, as a BFCL case's
            do): `make_for(row)` builds one, `make()` refuses.
    """

    id: str
    entry_point: EntryPoint
    kwargs: dict[str, Any] = field(default_factory=dict)
    dataset_builder: DatasetBuilder | str | None = None
    description: str | None = None
    sandbox: str = "local"
    per_row: bool = False

    @property
    def namespace(self) -> str | None:
        """The part before `/`, if any."""
        return parse_env_id(self.id)[0]

    @property
    def name(self) -> str:
        """The name without namespace and version."""
        return parse_env_id(self.id)[1]

    @property
    def version(self) -> int | None:
        """N of `-vN`, if any."""
        return parse_env_id(self.id)[2]

    @property
    def gymnasium_id(self) -> str:
        """The id under which gymnasium knows this environment."""
        return "toolgym/" + self.id.replace("/", ".")

    def make(self, sandbox: Any = None, **overrides: Any) -> Stepper:
        """A fresh instance with the spec's defaults updated by `overrides`, placed in
        `sandbox` (a backend name or object; default: the spec's `sandbox`)."""
        if self.per_row:
            raise TypeError(
                f"{self.id} builds each episode's environment from its row: "
                f"toolgym.spec({self.id!r}).make_for(row)"
            )
        factory = _resolve(self.entry_point, what=f"entry point of {self.id}")
        kwargs = {**self.kwargs, **overrides}
        where = self.sandbox if sandbox is None else sandbox
        if where == "local":
            return as_environment(factory(**kwargs))
        if not isinstance(factory, type):
            raise TypeError(
                f"{self.id}: sandbox={where!r} needs a class entry point (the worker imports it "
                f"by module and name); {factory!r} is not a class"
            )
        return sandboxed(factory, kwargs, where)

    def make_for(self, row: dict[str, Any], seed: int | None = None, **overrides: Any) -> Stepper:
        """The environment of the episode that plays `row` (any registered entry: one built
        per row, or the same for every row), in this process."""
        if not self.per_row:
            return self.make(**overrides)
        factory = _resolve(self.entry_point, what=f"entry point of {self.id}")
        return as_environment(factory(row, seed, **{**self.kwargs, **overrides}))

    def dataset(self, n: int, seed: int = 0, **kwargs: Any) -> datasets.Dataset:
        """`n` prompt rows (columns: `prompt` and the `reset` arguments), reproducible by seed."""
        if self.dataset_builder is None:
            raise ValueError(
                f"{self.id} has no prompt dataset builder; pass rows with a 'prompt' column and "
                "the reset() arguments yourself, or register it with dataset=..."
            )
        import datasets  # here, not at import: `import toolgym` stays light (0.8 s less)

        builder = _resolve(self.dataset_builder, what=f"dataset builder of {self.id}")
        rows = builder(n=n, seed=seed, **kwargs)
        return rows if isinstance(rows, datasets.Dataset) else datasets.Dataset.from_list(rows)


_registry: dict[str, EnvSpec] = {}
_entry_points_loaded = False


def parse_env_id(env_id: str) -> tuple[str | None, str, int | None]:
    """Split `namespace/Name-vN` into (namespace, name, version); ValueError if malformed."""
    match = _ID_PATTERN.fullmatch(env_id) if isinstance(env_id, str) else None
    if match is None:
        raise ValueError(
            f"malformed environment id {env_id!r}: expected 'Name-vN' or 'namespace/Name-vN' "
            "(letters, digits, '_', '-' and '.')"
        )
    version = match["version"]
    return match["namespace"], match["name"], int(version) if version is not None else None


def register(
    id: str,
    entry_point: EntryPoint,
    *,
    dataset: DatasetBuilder | str | None = None,
    description: str | None = None,
    sandbox: str = "local",
    per_row: bool = False,
    **defaults: Any,
) -> EnvSpec:
    """Register an environment under `id`; `defaults` are its constructor arguments.

    Args:
        id: `Name-vN` or `namespace/Name-vN`.
        entry_point: An environment class, a factory returning an instance (a plain class
            with `reset` and public methods is accepted too), or `"module:attr"`.
        dataset: A prompt dataset builder `f(n, seed, **kwargs)`, or `"module:attr"`.
        description: One line shown by `toolgym envs`.
        sandbox: Default placement of instances ("local", "process", "docker", "auto").
        per_row: `entry_point(row, seed, **defaults)` builds each episode's environment from
            its row (see `EnvSpec.per_row`); only in this process.
        **defaults: Constructor arguments used by `make(id)` unless overridden.
    """
    parse_env_id(id)
    if per_row and sandbox != "local":
        raise ValueError(f"{id}: an environment built per row is placed in this process only")
    if isinstance(entry_point, type):
        tool_table(entry_point)  # a method that cannot be a tool fails here, naming it
    if id in _registry:
        warnings.warn(f"Overriding environment {id!r} already in the registry.", stacklevel=2)
    spec = EnvSpec(id, entry_point, dict(defaults), dataset, description, sandbox, per_row)
    _registry[id] = spec
    for listener in _listeners:
        listener(spec)
    return spec


def spec(id: str) -> EnvSpec:
    """The registered EnvSpec for `id`; the error suggests close ids when there is none."""
    found = _registry.get(id)
    if found is None:
        load_entry_points()
        _load_namespaces(id.partition("/")[0] if "/" in id else "", required=True)
        found = _registry.get(id)
    if found is None:
        raise UnknownEnvironmentError(_unknown_id_message(id))
    return found


def make(id: str | EnvSpec, sandbox: Any = None, **overrides: Any) -> Stepper:
    """A new instance of a registered environment, with constructor `overrides`.

    `sandbox` places it: "local" (this process), "process" (a limited subprocess), "docker"
    (a container), "auto" (the strongest available), or a backend object; by default the
    environment's registered choice. What comes back is stepped (a `toolgym.Stepper`: `reset`,
    `step`, `tools`; the instance itself is `env.unwrapped`); a sandboxed instance has the
    same tools and behaves the same, as a `toolgym.sandbox.RemoteEnvironment`.
    """
    if not isinstance(id, (str, EnvSpec)):
        raise TypeError(
            f"make() takes a registered id or an EnvSpec, not {type(id).__name__}; for a class "
            "or a factory use toolgym.env_factory(target, kwargs, sandbox)(), or "
            "toolgym.as_environment(instance)"
        )
    env_spec = id if isinstance(id, EnvSpec) else spec(id)
    return env_spec.make(sandbox=sandbox, **overrides)


def env_factory(
    target: str | type | Callable[..., Any] | list[Callable[..., Any]],
    kwargs: dict[str, Any] | None = None,
    sandbox: Any = None,
) -> Callable[[], Stepper]:
    """What makes one rollout's environment, from what a user names: a registered id, an
    environment class, a factory returning an instance, or a list of tool functions. `kwargs`
    go to the constructor (or the factory); `sandbox` places an id or a class (a backend name
    or object; None: an id's registered choice, a class in this process). Unknown ids and
    impossible placements fail here, before any environment is made. Used by `make`'s callers
    alike: the trainer, the CLI and sandbox pools."""
    options = dict(kwargs or {})
    if isinstance(target, str):
        if spec(target).per_row:  # fails early on an unknown id too
            raise ValueError(
                f"{target} builds each episode's environment from its row: a trainer or "
                f"`toolgym eval` takes the id; by hand, toolgym.spec({target!r}).make_for(row)"
            )
        return lambda: make(target, sandbox=sandbox, **options)
    if isinstance(target, type):
        if sandbox in (None, "local"):
            return lambda: as_environment(target(**options))
        return lambda: sandboxed(target, options, sandbox)
    if sandbox not in (None, "local"):
        raise ValueError(
            f"sandbox={sandbox!r} places an environment class or a registered id (a worker "
            f"imports it by module and name), not {target!r}"
        )
    if isinstance(target, list):  # plain tool functions (checked by as_environment)
        functions = list(target)
        if options:
            raise ValueError("constructor arguments do not apply to a list of functions")
        return lambda: as_environment(functions)
    if callable(target):
        return lambda: as_environment(target(**options))
    raise TypeError(
        f"env must be an id, a class, a factory or a list of tool functions, not "
        f"{type(target).__name__}"
    )


def list_envs(namespace: str | None = None) -> list[str]:
    """The registered ids (including entry points), sorted; optionally of one namespace."""
    load_entry_points()
    _load_namespaces(namespace)
    return sorted(i for i, s in _registry.items() if namespace is None or s.namespace == namespace)


def load_entry_points(reload: bool = False) -> None:
    """Read the `toolgym.envs` entry points of installed packages (once, unless `reload`)."""
    global _entry_points_loaded
    if _entry_points_loaded and not reload:
        return
    _entry_points_loaded = True
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if _ID_PATTERN.fullmatch(entry.name) and re.search(r"-v\d+$", entry.name):
            if entry.name not in _registry:
                register(entry.name, entry.value)
            continue
        try:
            hook = entry.load()
            hook()
        except Exception as error:  # one broken plugin must not hide the others
            warnings.warn(
                f"toolgym: entry point {entry.name!r} = {entry.value!r} failed: {error!r}",
                stacklevel=2,
            )


def _load_namespaces(namespace: str | None, required: bool = False) -> None:
    """Register the `LAZY_NAMESPACES` named (None: all) that have no id registered yet."""
    for name, hook in LAZY_NAMESPACES.items():
        if namespace not in (None, name) or any(i.startswith(f"{name}/") for i in _registry):
            continue
        try:
            _resolve(hook, what=f"registration of {name}/")(register)
        except ImportError:
            if required:
                raise


def _resolve(target: Any, what: str) -> Callable[..., Any]:
    if isinstance(target, str):
        module_name, _, attribute = target.partition(":")
        if not attribute:
            raise ValueError(f"{what}: {target!r} must look like 'package.module:attribute'")
        target = getattr(importlib.import_module(module_name), attribute)
    if not callable(target):
        raise TypeError(f"{what} is not callable: {target!r}")
    return target


def _unknown_id_message(env_id: str) -> str:
    known = sorted(_registry)
    message = f"No environment registered with id {env_id!r}."
    try:
        namespace, name, _ = parse_env_id(env_id)
    except ValueError:
        namespace, name = None, env_id
    versions = [i for i in known if _same_family(i, namespace, name)]
    close = versions or difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    if close:
        message += f" Did you mean: {', '.join(close)}?"
    else:
        message += f" Registered: {', '.join(known) or 'none'}."
    return message + " (Packages register ids on import or through 'toolgym.envs' entry points.)"


def _same_family(env_id: str, namespace: str | None, name: str) -> bool:
    other_namespace, other_name, _ = parse_env_id(env_id)
    return other_namespace == namespace and other_name.lower() == name.lower()


_listeners: list[Callable[[EnvSpec], None]] = []


def on_register(listener: Callable[[EnvSpec], None]) -> None:
    """Call `listener(spec)` for every registered id, now and on each later `register`
    (`toolgym.gym` uses it to give each id a gymnasium id)."""
    _listeners.append(listener)
    for spec in list(_registry.values()):
        listener(spec)


# The built-in environments.
register(
    "Wordle-v0",
    "toolgym.builtin_envs.wordle:Wordle",
    dataset="toolgym.builtin_envs.wordle:wordle_dataset",
    description="Find a five-letter word in six guesses from colour feedback (guess tool).",
)
register(
    "Arithmetic-v0",
    "toolgym.builtin_envs.arithmetic:Arithmetic",
    dataset="toolgym.builtin_envs.arithmetic:arithmetic_dataset",
    description="Four-digit arithmetic with calculator tools, graded on the final answer.",
)
register(
    "GuessNumber-v0",
    "toolgym.builtin_envs.guess_number:GuessNumber",
    dataset="toolgym.builtin_envs.guess_number:guess_number_dataset",
    description="Find a number in 1..100 from higher/lower answers, in as few guesses as possible.",
)
register(
    "PythonREPL-v0",
    "toolgym.builtin_envs.python_repl:PythonREPL",
    dataset="toolgym.builtin_envs.python_repl:python_repl_dataset",
    description="A stateful Python session (run tool), sandboxed by default.",
    sandbox="auto",
)
register(
    "PythonLines-v0",
    "toolgym.builtin_envs.python_lines:PythonLines",
    dataset="toolgym.builtin_envs.python_lines:python_lines_dataset",
    description="Python written line by line, each statement run inline (inline protocol).",
    sandbox="auto",
)
