"""Rewards of finished episodes: the environment's own, reward functions, or both.

A reward function is called once per batch as

    f(prompts, completions, environments=..., trajectories=..., **columns) -> list[float | None]

where `prompts` are the rows' prompts, `completions` the messages each episode added after
the prompt, and `columns` the other dataset columns as lists. It may be async. `None` means
"no opinion" for that trajectory: the weighted sum is then taken over the sources that gave
one (a trajectory no source scores gets 0).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from toolgym.agents.trajectory import Trajectory
from toolgym.envs.calls import run_coroutine

RewardFunc = Callable[..., Any]


def compute_rewards(
    trajectories: Sequence[Trajectory],
    rows: Sequence[dict[str, Any]],
    environments: Sequence[Any],
    reward_funcs: Sequence[RewardFunc] = (),
    weights: Sequence[float] | None = None,
    env_reward: bool = True,
) -> tuple[list[float], dict[str, list[float]]]:
    """Weighted total reward per trajectory, and each source's values (NaN for None)."""
    sources: dict[str, list[float | None]] = {}
    if env_reward:
        sources["env"] = [t.reward for t in trajectories]
    for func in reward_funcs:
        sources[getattr(func, "__name__", "reward")] = _call(func, trajectories, rows, environments)
    if not sources:
        raise ValueError("no reward source: pass reward_funcs or keep env_reward=True")
    weights = list(weights) if weights is not None else [1.0] * len(sources)
    if len(weights) != len(sources):
        raise ValueError(f"{len(weights)} reward weights for {len(sources)} reward sources")
    totals: list[float] = []
    for index in range(len(trajectories)):
        pairs = zip(weights, sources.values(), strict=True)
        given = [(w, float(value)) for w, v in pairs if (value := v[index]) is not None]
        totals.append(sum((w * value for w, value in given), 0.0))
    table = {k: [math.nan if x is None else float(x) for x in v] for k, v in sources.items()}
    return totals, table


def _call(
    func: RewardFunc,
    trajectories: Sequence[Trajectory],
    rows: Sequence[dict[str, Any]],
    environments: Sequence[Any],
) -> list[float | None]:
    prompts = [row.get("prompt") for row in rows]
    completions = [t.messages[len(t.messages) - _added(t) :] for t in trajectories]
    columns = {k: [row.get(k) for row in rows] for k in rows[0] if k != "prompt"} if rows else {}
    values = func(
        prompts,
        completions,
        environments=list(environments),
        trajectories=list(trajectories),
        **columns,
    )
    if inspect.isawaitable(values):
        values = run_coroutine(_await(values))
    values = list(values)
    if len(values) != len(trajectories):
        name = getattr(func, "__name__", func)
        raise ValueError(
            f"reward function {name} returned {len(values)} values for "
            f"{len(trajectories)} trajectories"
        )
    return values


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _added(trajectory: Trajectory) -> int:
    """Messages the episode added after the prompt (the first assistant message onwards)."""
    for index, message in enumerate(trajectory.messages):
        if message.get("role") == "assistant":
            return len(trajectory.messages) - index
    return 0


def step_reward_total(trajectory: Trajectory) -> float:
    """The sum of an inline episode's per-step rewards (0 for chat episodes)."""
    return float(sum(step["reward"] for step in trajectory.step_rewards))


def step_reward_bonus(trajectory: Trajectory) -> list[float]:
    """Per completion token: the reward of the step whose span it belongs to (the model's
    tokens after the previous step's end, up to and including the marker that ended this
    step); 0 on tokens no step rewards."""
    bonus = [0.0] * len(trajectory.completion_ids)
    start = 0
    for step in trajectory.step_rewards:
        end = int(step["end"])
        for position in range(start, min(end, len(bonus))):
            bonus[position] = float(step["reward"])
        start = end
    return bonus
