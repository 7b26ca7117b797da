"""BFCL's multi-turn tool classes used unchanged (issue 47 item 3), checked against BFCL itself.

bfcl-eval is installed beside the project (`.bench/site`, as TRL is; `--no-deps`: its tool
classes need only mpmath). Its 8 multi-turn classes document arguments as `name (type): text`
and load state with `_load_scenario(initial_config)` instead of `reset`; toolgym reads the
docstrings as they are and takes a reset function beside the class. The 200 multi-turn base
cases' ground-truth calls are replayed through toolgym and through BFCL's own executor; the
results must hold the same values and BFCL's own state checker must find the same state.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from bfcl_site import bfcl_on_path
from bfcl_site import named_call as bfcl_named_call

import toolgym
from toolgym import ToolCall

CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


@pytest.fixture(scope="module")
def bfcl():
    """bfcl_eval's folder and its 8 multi-turn classes."""
    with bfcl_on_path() as root:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

        classes = {
            name: getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
            for name in CLASSES
        }
        yield root, classes


def load_scenario(instance: Any, initial_config: dict, **row: Any) -> None:
    """A reset beside a BFCL class: its part of the row's `initial_config`, loaded as BFCL
    loads it (stateless classes have nothing to load)."""
    if hasattr(instance, "_load_scenario"):
        state = copy.deepcopy(initial_config.get(type(instance).__name__, {}))
        instance._load_scenario(state, long_context=False)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_classes_schemas_match_bfcls_function_docs(bfcl):
    root, classes = bfcl
    docs = {
        d["name"]: d for f in (root / "data/multi_turn_func_doc").glob("*.json") for d in jsonl(f)
    }
    tools = {}
    for cls in classes.values():
        env = toolgym.as_environment(cls(), reset=load_scenario)
        tools.update({t["function"]["name"]: t["function"]["parameters"] for t in env.tools})
    assert len(tools) == 128
    for name, parameters in tools.items():
        theirs = docs[name]["parameters"]
        assert set(parameters["properties"]) == set(theirs["properties"]), name
        assert set(parameters.get("required", [])) == set(theirs.get("required", [])), name


def test_ground_truth_calls_replay_to_bfcls_values_and_state(bfcl):
    """Each call through toolgym returns what BFCL's executor returns (BFCL writes a dict as
    JSON, toolgym as TRL does, `str()`: compared as values), and after each case BFCL's state
    checker finds toolgym's instances in the ground truth's state."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker

    root, classes = bfcl
    cases = jsonl(root / "data/BFCL_v4_multi_turn_base.json")
    truth = jsonl(root / "data/possible_answer/BFCL_v4_multi_turn_base.json")
    answers = {d["id"]: d["ground_truth"] for d in truth}
    assert len(cases) == 200
    calls = 0
    try:
        for case in cases:
            envs = {}
            for name in case["involved_classes"]:
                envs[name] = toolgym.as_environment(classes[name](), reset=load_scenario)
                envs[name].reset(initial_config=case["initial_config"])
            owner = {t["function"]["name"]: env for env in envs.values() for t in env.tools}
            for turn in answers[case["id"]]:
                theirs, their_instances = multi_turn_utils.execute_multi_turn_func_call(
                    turn, case["initial_config"], case["involved_classes"], "toolgym", case["id"]
                )
                for text, their in zip(turn, theirs, strict=True):
                    name, arguments = named_call(text, owner)
                    step = owner[name].step(ToolCall(name, arguments))
                    assert same_value(step.messages[0]["content"], their), (case["id"], text)
                    calls += 1
            mine = {name: env.unwrapped for name, env in envs.items()}
            assert state_checker(mine, their_instances)["valid"], case["id"]
    finally:  # BFCL's executor keeps each case's instances in its module's globals
        for key in [k for k in vars(multi_turn_utils) if k.startswith("toolgym_")]:
            delattr(multi_turn_utils, key)
    assert calls == 1142


def named_call(text: str, tools: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call -> the tool's name and its arguments by name (`bfcl_site`)."""
    name = text.split("(", 1)[0].strip()
    return bfcl_named_call(text, getattr(tools[name].unwrapped, name))


def same_value(mine: str, theirs: str) -> bool:
    """The same text, or the same value written as Python (`str`) and as JSON (BFCL)."""
    if mine == theirs:
        return True
    try:
        return ast.literal_eval(mine) == json.loads(theirs)
    except (ValueError, SyntaxError):
        return False


def test_a_reset_beside_the_class_is_refused_where_it_is_ambiguous_or_no_function(bfcl):
    _, classes = bfcl

    class WithReset:
        def reset(self, **kwargs: Any) -> None:
            pass

    with pytest.raises(TypeError, match="has a reset\\(\\) of its own"):
        toolgym.as_environment(WithReset(), reset=load_scenario)
    with pytest.raises(TypeError, match="must be a function"):
        toolgym.as_environment(classes["MathAPI"](), reset="load")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no reset\\(\\)"):
        toolgym.as_environment(classes["MathAPI"]())
