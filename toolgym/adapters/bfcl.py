"""BFCL's multi-turn test cases as episodes, graded by BFCL's own checker.

The Berkeley Function Calling Leaderboard (PyPI `bfcl-eval`) ships its multi-turn worlds as
plain Python classes whose methods are the tools (a file system, a trading bot, a travel
API, ...). A test case names the classes it involves, their initial state, the user's turns
and the ground truth's calls per turn. Here each case is one episode:

    rows = bfcl_rows("multi_turn_base")              # 200 rows from the installed package
    envs = [bfcl_environment(row) for row in rows]   # or pass `bfcl_environment` as a factory
    agent.run(envs, rows)

    toolgym eval bfcl/multi_turn_base --model smollm2-135m -n 8   # registered, built per row

- **Tools**: the public methods of the case's classes (their BFCL docstrings give the
  schemas; arguments reach them as sent, as BFCL passes them), less the case's
  `excluded_function`s; each class's state is loaded as BFCL loads it
  (`_load_scenario` of its part of `initial_config`).
- **User turns**: the episode starts with the first turn's message; each answer without a
  tool call hands the model the next turn (`Environment.user_turn`), until the last.
- **Categories**: `multi_turn_base`; `multi_turn_long_context` (the classes' states loaded
  with BFCL's long-context padding); `multi_turn_miss_param` (a turn lacks what its calls
  need: the answer asks, the next turn tells); `multi_turn_miss_func` (some methods are held
  back: they are not tools until their turn, whose message is BFCL's "I have updated some
  more functions" after their JSON schemas, as BFCL shows prompting models; from then on the
  episode's instance carries them as tools).
- **Reward**: 1.0 where BFCL's `multi_turn_checker` finds the episode valid (after each turn
  the state of every instance, and the calls' results, as the ground truth's), else 0.0, the
  checker's error type kept in `check`. The checker re-executes the episode's calls itself, as
  BFCL does with a model's decoded answer: each call the tools ran is handed to it as the text
  `name(arg=value, ...)` written by this module from the call's arguments (`repr` of JSON
  values: literals only), never text the model wrote.

bfcl-eval pins many packages its tool classes do not use: `pip install --no-deps bfcl-eval
mpmath` gives what this module needs (toolgym's own set-up installs it into `.bench/site`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import types
import uuid
from pathlib import Path
from typing import Any

from toolgym.envs.core import Environment
from toolgym.envs.tools import instance_tools

CATEGORIES = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_param",
    "multi_turn_miss_func",
)
"""BFCL's multi-turn categories (all that `bfcl-eval` ships; its `composite` has no data)."""


def bfcl_package() -> Any:
    """The installed `bfcl_eval` (a clear error naming how to install it)."""
    try:
        return importlib.import_module("bfcl_eval")
    except ImportError as error:
        raise ImportError(
            "BFCL's cases need the bfcl-eval package: pip install --no-deps bfcl-eval mpmath"
        ) from error


def bfcl_rows(category: str = "multi_turn_base", n: int | None = None) -> list[dict[str, Any]]:
    """The category's test cases as rows (`id`, `question`, `initial_config`,
    `involved_classes`, `excluded_function`, `ground_truth`, `missed_function` in
    `multi_turn_miss_func`, and an empty `prompt`: the episode's first message is the first
    user turn), read from the installed package."""
    if category not in CATEGORIES:
        raise ValueError(f"BFCL category {category!r}: one of {', '.join(CATEGORIES)}")
    data = Path(bfcl_package().__file__).parent / "data"
    cases = _jsonl(data / f"BFCL_v4_{category}.json")
    truth = {
        row["id"]: row["ground_truth"]
        for row in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")
    }
    rows = [{**case, "prompt": [], "ground_truth": truth[case["id"]]} for case in cases]
    return rows[:n] if n is not None else rows


def bfcl_dataset(
    n: int, seed: int = 0, category: str = "multi_turn_base", **_: Any
) -> list[dict[str, Any]]:
    """The registered ids' dataset builder: the category's first `n` cases in BFCL's order
    (`seed` changes nothing: the leaderboard's cases are fixed), each case's `initial_config`
    and `missed_function` as JSON text (their shapes differ from case to case, which a
    table's columns would merge)."""
    rows = bfcl_rows(category, n)
    return [
        {key: json.dumps(value) if key in _JSON_COLUMNS else value for key, value in row.items()}
        for row in rows
    ]


_JSON_COLUMNS = ("initial_config", "missed_function")


def register_categories(register: Any) -> None:
    """Register `bfcl/<category>` for each playable category (the registry calls this while
    no `bfcl/` id is registered); ImportError, naming the install, without bfcl-eval."""
    bfcl_package()
    for category in CATEGORIES:
        register(
            f"bfcl/{category}",
            bfcl_environment,
            dataset=functools.partial(bfcl_dataset, category=category),
            description=f"BFCL {category}: the user's turns, graded by BFCL's checker",
            per_row=True,
        )


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class BFCLCase(Environment):
    """One BFCL multi-turn test case (see the module docstring); `bfcl_environment` makes the
    subclass whose tools are the case's classes' methods."""

    classes: tuple[str, ...] = ()
    """The BFCL classes whose methods this subclass offers as tools."""
    reward_per_step = False
    """The reward is BFCL's checker re-executing the whole episode: read once, when it ends,
    not around every step."""
    strict_arguments = True
    """Arguments reach the methods as the call holds them, as BFCL's own executor passes
    them (its ground truth sends `ticket_id='ticket_001'` where the hint says `int`)."""

    def reset(
        self,
        id: str = "",
        question: list[list[dict[str, str]]] | None = None,
        initial_config: dict[str, Any] | str | None = None,
        ground_truth: list[list[str]] | None = None,
        missed_function: dict[str, list[str]] | str | None = None,
        **row: Any,
    ) -> str:
        from bfcl_eval.constants.executable_backend_config import (
            CLASS_FILE_PATH_MAPPING,
            STATELESS_CLASSES,
        )

        config: dict[str, Any] = _unpacked(initial_config)
        self.held_back: dict[int, list[str]] = {
            int(turn): names for turn, names in _unpacked(missed_function).items()
        }
        """Per turn index, the methods that become tools at that turn (`multi_turn_miss_func`)."""
        self.category = id.rsplit("_", 1)[0]
        long_context = "long_context" in self.category  # as BFCL's handlers and checker read it
        self.case = {
            "id": id,
            "initial_config": config,
            "involved_classes": list(self.classes),
        }
        self.turns = question or []
        self.truth = ground_truth or []
        if not self.turns or len(self.turns) != len(self.truth):
            raise ValueError(f"BFCL case {id!r}: its questions and ground truth do not pair")
        self.instances: dict[str, Any] = {}
        for name in self.classes:
            instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
            if name not in STATELESS_CLASSES:
                state = json.loads(json.dumps(config.get(name, {})))  # a copy of its own
                instance._load_scenario(state, long_context=long_context)
            self.instances[name] = instance
        self.turn = 0
        self.calls: list[list[list[str]]] = [[] for _ in self.turns]
        """Per user turn, the calls the tools ran (one step each), as BFCL's checker reads them."""
        self.check: dict[str, Any] | None = None
        """BFCL's latest verdict (its error type where invalid)."""
        self.finished, self._final = False, False
        return _user_text(self.turns[0])

    def user_turn(self, answer: str) -> str | None:
        if self.turn + 1 >= len(self.turns):
            self.finished = True
            return None
        self.turn += 1
        if self.turn in self.held_back:
            return self._hand_over(self.held_back[self.turn])
        return _user_text(self.turns[self.turn])

    def _hand_over(self, names: list[str]) -> str:
        """Make the held-back methods `names` tools of this episode's instance (bound on it,
        so only from now on) and tell the model of them as BFCL tells prompting models."""
        from bfcl_eval.constants.default_prompts import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
        )

        for name in names:
            owner, function = _method(self.classes, name)
            setattr(self, name, types.MethodType(_tool(owner, name, function), self))
        table = instance_tools(self)
        schemas = json.dumps([table[name].schema["function"] for name in names])
        return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=schemas)

    def get_reward(self) -> float:
        """1.0 where BFCL's checker finds the calls so far valid (`check` keeps its verdict);
        once the last turn is answered the verdict is final and read once."""
        if self.check is None or not self._final:
            self.check = _checked(self.calls, self.truth, self.case)
            self._final = self.finished
        return 1.0 if self.check["valid"] else 0.0

    def episode_metrics(self) -> dict[str, float]:
        return {
            "turns_reached": float(self.turn + 1),
            "turns": float(len(self.turns)),
            "calls": float(sum(len(steps) for steps in self.calls)),
        }

    def _record(self, name: str, arguments: dict[str, Any]) -> None:
        text = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
        self.calls[self.turn].append([f"{name}({text})"])


def _unpacked(value: Any) -> dict[str, Any]:
    """A row's mapping, which a dataset's column holds as JSON text."""
    return json.loads(value) if isinstance(value, str) else dict(value or {})


def _method(classes: tuple[str, ...], name: str) -> tuple[str, Any]:
    """The BFCL class among `classes` that defines the method `name`, and the function."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    for owner in classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[owner]), owner)
        if callable(getattr(cls, name, None)) and not name.startswith("_"):
            return owner, getattr(cls, name)
    raise ValueError(f"BFCL: no class of {', '.join(classes)} has a method {name!r}")


def _user_text(turn: list[dict[str, str]]) -> str:
    return "\n\n".join(str(message.get("content", "")) for message in turn)


def _checked(
    calls: list[list[list[str]]], truth: list[list[str]], case: dict[str, Any]
) -> dict[str, Any]:
    """BFCL's `multi_turn_checker` on the episode's calls; the instances it keeps in its
    module's globals for the check are removed after."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model = f"toolgym_{uuid.uuid4().hex}"
    try:
        category = case["id"].rsplit("_", 1)[0]  # BFCL's checker reads it from the id too
        result = multi_turn_checker(calls, truth, case, category, model)
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(model)]:
            delattr(multi_turn_utils, key)
    return {k: v for k, v in result.items() if k in ("valid", "error_type", "error_message")}


@functools.cache
def bfcl_case_class(classes: tuple[str, ...], excluded: tuple[str, ...] = ()) -> type[BFCLCase]:
    """The `BFCLCase` subclass whose tools are the public methods of `classes` (BFCL's
    names), less `excluded`."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    tools: dict[str, Any] = {}
    for name in classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
        for method, function in inspect.getmembers(cls, inspect.isfunction):
            if not method.startswith("_") and method not in excluded:
                tools[method] = _tool(name, method, function)
    title = "BFCL_" + "_".join(classes)
    return type(title, (BFCLCase,), {"classes": classes, **tools, "__module__": __name__})


def _tool(owner: str, method: str, function: Any) -> Any:
    """A tool that runs `owner`'s `method` on the episode's instance and records the call."""

    @functools.wraps(function)
    def tool(self: BFCLCase, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(function).bind(self.instances[owner], *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        self._record(method, arguments)
        return function(self.instances[owner], *args, **kwargs)

    return tool


def bfcl_environment(row: dict[str, Any], seed: int | None = None) -> BFCLCase:
    """An episode's environment for a `bfcl_rows` row (an `EpisodeFactory`; the entry point
    of the registered `bfcl/<category>` ids, built per row). The methods a
    `multi_turn_miss_func` case holds back are left out of the class's tools; the episode
    binds them at their turn."""
    held_back = [name for names in _unpacked(row.get("missed_function")).values() for name in names]
    excluded = sorted({*(row.get("excluded_function") or ()), *held_back})
    return bfcl_case_class(tuple(row["involved_classes"]), tuple(excluded))()
