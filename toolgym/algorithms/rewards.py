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
    """The sum of the episode's step rewards that its reward does not already hold: an inline
    episode's per-step rewards; not a tool call's (`in_reward`: the change of the
    environment's reward, part of it already). 0 for an episode without such."""
    return float(
        sum(step["reward"] for step in trajectory.step_rewards if not step.get("in_reward"))
    )


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
