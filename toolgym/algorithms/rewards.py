"""Rewards of finished episodes: the environment's own, reward functions, or both.

A reward function is called once per batch with keyword arguments, as TRL calls it:

    f(prompts=..., completions=..., completion_ids=..., environments=..., trajectories=...,
      trainer_state=..., log_extra=..., log_metric=..., **columns) -> list[float | None]

`prompts` are the prompts as the model read them (the row's messages with reset's
observation appended, as TRL passes them), `completions` the messages each episode added after
the prompt, `completion_ids` each episode's completion tokens (model and tool tokens, as TRL's),
`environments` the episodes' environments (a plain class's own instances, as TRL passes them;
see `_as_given`), `trajectories` toolgym's records,
`trainer_state` a `transformers.TrainerState` (`global_step`, `max_steps`, `epoch`),
`log_extra(column, values)` and `log_metric(name, value)` TRL's logging hooks, and `columns`
the other dataset columns as lists. A function that takes no `**kwargs` gets only the
arguments it names. It may be async. `None` (or NaN, as TRL reads it) means "no opinion" for
that episode: the weighted sum is taken over the sources that gave a value (an episode no
source scores is left out of its group's baseline and the update, as TRL leaves it, with a
warning); any other value must be a finite number.

Which sources score an episode (TRL's rule for TRL-shaped classes, so a reward is never
counted twice):
- a `toolgym.Environment` subclass, or an executor-backed environment (MCP, OpenEnv): its
  own reward (`reward` / `get_reward()`) is a source beside the reward functions
  (`GRPOConfig.env_reward=False` leaves it out);
- a plain class (TRL's `environment_factory` shape): its `get_reward()` is a source where the
  class defines one, as TRL adds it; a `reward` attribute is state a reward function may
  read, never a source of its own, unless no reward function is given (then it is the reward,
  where TRL would refuse to train).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.trajectory import MODEL_FAILURES, Trajectory
from toolgym.envs.calls import run_coroutine

RewardFunc = Callable[..., Any]
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # never passed as columns (TRL)


@dataclass
class RewardLogs:
    """What reward functions logged in one batch through TRL's hooks."""

    metrics: dict[str, list[float]] = field(default_factory=dict)
    """`log_metric(name, value)` calls: every value by name (a step logs their mean)."""
    extras: dict[str, list[Any]] = field(default_factory=dict)
    """`log_extra(column, values)` calls: one value per episode by column."""

    def log_metric(self, name: str, value: float) -> None:
        """TRL's `log_metric`: one value of metric `name` for this batch."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """TRL's `log_extra`: one value of `column` per episode, kept on the trajectories."""
        self.extras.setdefault(str(column), []).extend(values)


def compute_rewards(
    trajectories: Sequence[Trajectory],
    rows: Sequence[dict[str, Any]],
    environments: Sequence[Any],
    reward_funcs: Sequence[RewardFunc] = (),
    weights: Sequence[float] | None = None,
    env_reward: bool = True,
    *,
    trainer_state: Any = None,
    logs: RewardLogs | None = None,
    model_failure_reward: float | None = None,
) -> tuple[list[float | None], dict[str, list[float]]]:
    """Weighted total reward per trajectory (None for one that no source scored: as TRL does,
    the trainer leaves it out of its group's baseline and of the update), and each source's
    values (NaN for None).

    `weights` lists one weight per source in order (the environment's first, when it is a
    source, then each function's), or, as TRL takes them, one per reward function (the
    environment's reward then weighs 1). `model_failure_reward` (`AgentLimits`'): an episode
    the model's own failure ended keeps the penalty its reward holds, whatever the class."""
    logs = logs if logs is not None else RewardLogs()
    sources: dict[str, list[float | None]] = {}
    if env_reward:
        envs = _padded(environments, trajectories)
        sources["env"] = [
            t.reward
            if _env_scores(env, bool(reward_funcs))
            or (model_failure_reward is not None and t.status in MODEL_FAILURES)
            else None
            for t, env in zip(trajectories, envs, strict=True)
        ]
    for func in reward_funcs:
        name = getattr(func, "__name__", "reward")
        sources[name] = _call(func, trajectories, rows, environments, trainer_state, logs)
    if not sources:
        raise ValueError("no reward source: pass reward_funcs or keep env_reward=True")
    weights = _weights(weights, list(sources), len(reward_funcs), env_reward)
    totals: list[float | None] = []
    for index in range(len(trajectories)):
        pairs = zip(weights, sources.values(), strict=True)
        given = [(w, float(value)) for w, v in pairs if (value := v[index]) is not None]
        totals.append(sum((w * value for w, value in given), 0.0) if given else None)
    # an episode that failed (a judge that could not score it) is left out already: not told
    outcomes = zip(trajectories, totals, strict=True)
    unscored = sum(total is None and not trajectory.failed for trajectory, total in outcomes)
    if unscored:
        warnings.warn(
            f"{unscored} of {len(trajectories)} episodes got no reward from any source "
            f"({', '.join(sources)}): left out of their groups' baselines and the update, as "
            "TRL leaves them",
            stacklevel=2,
        )
    table = {k: [math.nan if x is None else float(x) for x in v] for k, v in sources.items()}
    return totals, table


def _weights(
    weights: Sequence[float] | None, sources: list[str], functions: int, env_reward: bool
) -> list[float]:
    """One weight per source: as given, all 1, or TRL's one per function (the
    environment's reward, a source TRL adds itself, then weighs 1)."""
    if weights is None:
        return [1.0] * len(sources)
    if env_reward and functions and len(weights) == functions:
        return [1.0, *weights]
    if len(weights) != len(sources):
        raise ValueError(
            f"{len(weights)} reward weights for {len(sources)} reward sources "
            f"({', '.join(sources)}); give one per source, or one per reward function"
        )
    return list(weights)


def _padded(environments: Sequence[Any], trajectories: Sequence[Trajectory]) -> list[Any]:
    return (
        list(environments) if len(environments) == len(trajectories) else [None] * len(trajectories)
    )


def reward_owner(env: Any) -> str:
    """How an environment scores its episodes: "environment" (a `toolgym.Environment`
    subclass, a list of tool functions, an executor-backed environment, or one toolgym cannot
    see the class of),
    "get_reward" (a plain class that defines it) or "attribute" (a plain class without it)."""
    from toolgym.envs.core import Environment
    from toolgym.envs.tools import FUNCTION_TOOLS

    executor = getattr(env, "executor", None)
    target = getattr(executor, "target", None)
    if not isinstance(target, type) or target is type(executor):  # MCP, OpenEnv: the server's
        return "environment"
    if issubclass(target, Environment) or getattr(target, FUNCTION_TOOLS, False):
        return "environment"  # toolgym's own kinds, not TRL-shaped classes
    return "get_reward" if callable(getattr(target, "get_reward", None)) else "attribute"


def _as_given(env: Any) -> Any:
    """What a reward function gets as an episode's environment: a plain class's instance, as
    TRL passes it (its attributes read directly); a `toolgym.Environment`'s stepped
    environment (`.unwrapped` is the instance), and a sandboxed one's host-side proxy."""
    instance = getattr(env, "unwrapped", None)
    if instance is not None and reward_owner(env) in ("get_reward", "attribute"):
        return instance
    return env


def _env_scores(env: Any, with_functions: bool) -> bool:
    return not (with_functions and reward_owner(env) == "attribute")


def _call(
    func: RewardFunc,
    trajectories: Sequence[Trajectory],
    rows: Sequence[dict[str, Any]],
    environments: Sequence[Any],
    trainer_state: Any,
    logs: RewardLogs,
) -> list[float | None]:
    names = rows[0] if rows else {}
    columns = {k: [row.get(k) for row in rows] for k in names if k not in _NOT_COLUMNS}
    arguments: dict[str, Any] = {
        **columns,
        "prompts": [_prompt(t) for t in trajectories],
        "completions": [t.messages[len(t.messages) - _added(t) :] for t in trajectories],
        "completion_ids": [_completion_ids(t) for t in trajectories],
        "environments": [_as_given(env) for env in environments],
        "trajectories": list(trajectories),
        "trainer_state": trainer_state,
        "log_extra": logs.log_extra,
        "log_metric": logs.log_metric,
    }
    name = getattr(func, "__name__", repr(func))
    values = func(**_accepted(func, arguments))
    if inspect.isawaitable(values):
        values = run_coroutine(_await(values))
    values = list(values)
    if len(values) != len(trajectories):
        raise ValueError(
            f"reward function {name} returned {len(values)} values for "
            f"{len(trajectories)} trajectories"
        )
    return [_checked(name, index, value) for index, value in enumerate(values)]


def _accepted(func: RewardFunc, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments`, or only those `func` names when it takes no `**kwargs`."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: give it everything
        return arguments
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return arguments
    named = {p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return {k: v for k, v in arguments.items() if k in named}


def _checked(name: str, index: int, value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"reward function {name} returned {value!r} for episode {index}: "
            "a reward is a number or None"
        ) from None
    if math.isnan(number):
        return None  # TRL turns None into NaN and skips it; NaN is "no opinion" here too
    if math.isinf(number):
        raise ValueError(
            f"reward function {name} returned {number} for episode {index}: "
            "a reward is a finite number or None"
        )
    return number


def _prompt(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The prompt as the model read it: the row's messages with reset's observation appended
    (TRL passes its rebuilt prompt too)."""
    return trajectory.messages[: len(trajectory.messages) - _added(trajectory)]


def _completion_ids(trajectory: Trajectory) -> list[int]:
    """Every token after the first prompt (model and tool tokens), as TRL's `completion_ids`."""
    first, last = trajectory.samples[0], trajectory.samples[-1]
    return list((last.prompt_ids + last.completion_ids)[len(first.prompt_ids) :])


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _added(trajectory: Trajectory) -> int:
    """Messages the episode added after the prompt (the first assistant message onwards)."""
    for index, message in enumerate(trajectory.messages):
        if message.get("role") == "assistant":
            return len(trajectory.messages) - index
    return 0


def step_reward_total(trajectory: Trajectory) -> float:
    """The sum of the episode's step rewards that its reward does not already hold: an inline
    episode's per-step rewards and a chat episode's `AgentLimits.invalid_call_reward`s; not a
    tool call's (`in_reward`: the change of the environment's reward, part of it already).
    0 for an episode without such."""
    return float(
        sum(step["reward"] for step in trajectory.step_rewards if not step.get("in_reward"))
    )


def has_own_step_rewards(trajectory: Trajectory) -> bool:
    """Whether the episode has step rewards its reward does not already hold (those
    `step_reward_total` sums): without any, an episode no source scored stays unscored."""
    return any(not step.get("in_reward") for step in trajectory.step_rewards)


def step_reward_sample(trajectory: Trajectory, step: dict[str, float]) -> int:
    """The index in `trajectory.samples` of the sample a step reward's positions refer to:
    its `sample`, else the last (inline episodes, and files written before chat episodes had
    step rewards)."""
    last = len(trajectory.samples) - 1
    sample = int(step.get("sample", last))
    if not 0 <= sample <= last:
        raise ValueError(f"a step reward names sample {sample} of {last + 1}: {step}")
    return sample


def step_reward_bonus(trajectory: Trajectory, sample: int = -1) -> list[float]:
    """Per completion token of one sample (`sample`, an index in `trajectory.samples`; default
    the last): the reward of the step whose span holds it, 0 on tokens no step rewards.

    A step's span ends at its `end` (exclusive) and starts at its `start`, else at the end of
    the sample's previous step (0 for its first): an inline step's span is the model's tokens
    after the previous marker up to and including its own; a tool call's (`start` given) is
    the assistant turn that made the call. Steps whose spans overlap add up."""
    index = sample % len(trajectory.samples)
    bonus = [0.0] * len(trajectory.samples[index].completion_ids)
    previous: dict[int, int] = {}  # sample -> end of its last step
    for step in trajectory.step_rewards:
        at = step_reward_sample(trajectory, step)
        end = int(step["end"])
        start = int(step.get("start", previous.get(at, 0)))
        previous[at] = end
        if at == index:
            for position in range(max(start, 0), min(end, len(bonus))):
                bonus[position] += float(step["reward"])
    return bonus
