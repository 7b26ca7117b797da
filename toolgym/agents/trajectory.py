"""`Trajectory`: one episode as samples (token ids, loss masks, logprobs), messages, reward
(with its sources) and status."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal[
    "finished",  # the model answered without a tool call, or through an `ends_episode` tool
    "env_done",  # the environment ended the episode (won, lost, solved)
    "max_turns",  # the agent's or the environment's turn limit
    "length",  # the episode token budget, the context length, or a turn's max_tokens
    "tool_timeout",  # the model's tool calls ran past a time limit (one call's or the turn's)
    "tool_crash",  # the model's call killed or crippled the worker running it
    "too_many_calls",  # one turn asked for more tool calls than max_tool_calls_per_turn
    "env_error",  # reset(), the reward, or the environment itself failed (not the model)
    "engine_error",  # the generation engine failed
    "judge_error",  # a judge model could not score the episode (toolgym.judges)
]
"""How an episode ended.

What the model causes is the model's: every status but the infrastructure failures is an
outcome of the policy, and enters the baselines and the loss with the reward the environment
reports (typically 0 for an episode that failed; a dead sandbox worker's last reported
reward), or `AgentLimits.model_failure_reward` for the model's failures where it is set. In
particular (issue 32 item 5):

- `tool_timeout` is the model's: its calls decide how long the tools run (code that sleeps
  or spins, a call that waits on purpose, many calls that add up). It applies to each call
  (`AgentLimits.tool_call_timeout`, and a sandbox's own per-request limit) and to a turn's
  calls together (`AgentLimits.tool_timeout`), and to the model's text handed to
  `inline_step` / `final_answer`. An environment whose tools can hang for reasons of its own
  (a remote service) must bound them itself and report the failure in the result.
- `tool_crash`: a sandbox worker that was alive when the model's call began and died, broke
  the protocol or ran out of memory during it (a `ModelFailure`,
  `toolgym.sandbox.remote.model_caused`): the model's code exhausted memory, killed its
  worker, or wrote to the protocol channel.
- `too_many_calls`: the turn is not run at all; the episode ends.

Only failures the model cannot cause are `INFRASTRUCTURE_FAILURES`, left out of baselines and
the loss (and counted): `env_error` (reset() failing, a worker that never started, a lost
node or Ray actor, the reward or the episode metrics unreadable, the environment's own code
raising outside a tool call), `engine_error` and `judge_error` (a judge model that timed out,
failed or answered without the scores asked for: `toolgym.judges`).
"""
STATUSES: tuple[str, ...] = Status.__args__  # type: ignore[attr-defined]
INFRASTRUCTURE_FAILURES = frozenset({"env_error", "engine_error", "judge_error"})
"""Statuses no policy can cause: excluded from baselines and the loss (`Trajectory.failed`)."""
MODEL_FAILURES = frozenset({"tool_timeout", "tool_crash", "too_many_calls"})
"""Failures the model's calls caused: in the loss, with the environment's reward."""


SAMPLE_FIELDS = ("prompt_ids", "completion_ids", "loss_mask", "logprobs")


@dataclass
class Sample:
    """One training sequence: a prompt, then tokens with a loss mask (1: sampled by the model,
    0: observation) and the engine's logprobs (0.0 on observation tokens)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    """The images its ids show, in order (data URLs; `toolgym.agents.images`)."""
    versions: list[int] = field(default_factory=list)
    """Per completion token, the engine's `weights_version` that sampled it (-1: an
    observation token, or an engine that counts no versions); empty where not recorded."""
    parent: int | None = None
    """The index (in its trajectory's `samples`) of the sample this one continues: its prompt
    is that sample's conversation carried on, re-rendered (the next turn of a per-turn
    episode, a user turn past a template's broken prefix) or compacted (`Compaction`). None:
    a root (the episode's first sample)."""
    role: str = "policy"
    """The policy role that sampled its tokens (one policy: "policy")."""

    def append(
        self,
        ids: list[int],
        sampled: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        """Append model tokens (`sampled=True`, with their logprobs and the weights versions
        that sampled them) or observation tokens."""
        recorded = len(self.versions) == len(self.completion_ids)
        self.completion_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        if recorded:
            known = sampled and versions is not None and len(versions) == len(ids)
            self.versions.extend(versions if known and versions is not None else [-1] * len(ids))


@dataclass
class Trajectory:
    """One episode, ready for a policy-gradient update.

    Attributes:
        samples: What the update trains on, a graph of samples (each names its `parent`): one
            `Sample` for an episode played as one sequence (prompt, then model and
            observation tokens interleaved: tool results, user turns); one per assistant turn
            for episodes built turn by turn (templates that are not prefix-preserving,
            `TemplateProfile.per_turn`: each turn's prompt is the template's rendering of the
            conversation before it); a new sample where a context budget compacted the
            conversation (`toolgym.agents.compaction`) or a user turn broke the template's
            prefix. The last sample is the episode as the model last saw it.
        messages: The conversation: prompt messages, then assistant and tool messages (assistant
            turns: parsed `content`, `reasoning_content`, `tool_calls`, and `raw_content`).
        reward: The episode's total reward: the environment's, or, in training, the weighted
            sum of `reward_sources` (see `GRPOConfig.reward_weights`); None where the
            environment gave none and nothing replaced it (TRL's and OpenEnv's "no reward":
            it counts 0, as TRL sums the sources that score).
        reward_sources: What the total is made of, unweighted, by source: `env` (the episode's
            reward as played: the environment's, or `AgentLimits.model_failure_reward`), each
            reward function by name, and `step_rewards` (the sum of the per-step rewards the
            environment's reward does not hold: an inline episode's, and a chat episode's
            `AgentLimits.invalid_call_reward`s; a chat episode's other step rewards are part
            of `env`); None where a source gave no value.
        status: How the episode ended; one of `STATUSES`.
        error: What went wrong, for the failure statuses.
        metrics: turns, tool_calls, tool_failures, parse_failures, generation_seconds,
            tool_seconds, model_tokens, observation_tokens.
        row: The dataset row the episode was reset with (without its prompt).
        step_rewards: The reward of each environment step, with the span of the model's
            tokens it rewards (`GRPOConfig.step_rewards` says what training does with them).
            Inline episodes: `end`, the index in the last sample's `completion_ids` just past
            the span (the marker's token; the span starts at the previous step's end), e.g.
            `[{"end": 14, "reward": -0.3}]`; separate from the episode's reward. Chat episodes
            (and `RolloutContext.step`): each turn whose tool calls changed the environment's
            reward (`StepResult.reward`; a change of 0 is not kept), with `sample` (the index
            in `samples` of the turn's sample), `start` and `end` (the turn's tokens in its
            `completion_ids`) and `in_reward: 1` (the episode's reward already holds it), e.g.
            `[{"sample": 0, "start": 0, "end": 21, "reward": 0.1, "in_reward": 1}]`; a turn
            with calls refused before any tool ran also gets `AgentLimits.invalid_call_reward`
            per such call, with `in_reward: 0`.
        env_metrics: The environment's named figures of the episode besides its reward
            (`Environment.episode_metrics`, e.g. Wordle's `valid_guesses`), read when it ended.
        extras: Values reward functions logged for this episode with TRL's `log_extra(column,
            values)`, by column.
        judgements: Each judge call that scored this episode (`toolgym.judges.Judge`): the
            judge, its model, the chat it was asked, its answer, the score (and each
            criterion's) or the error, seconds, and whether the answer was cached.
        role_rewards: Each role's own reward, where an episode's samples play several roles
            scored apart (two players, a proposer and a solver; set by a rollout function);
            a role without one gets `reward`. Training gives each role a baseline of its own
            (`toolgym.algorithms.role_baselines`).
        shared: Tree rollouts (`GRPOConfig.branch_at_turn`): per sample, how many of its
            completion tokens (from the start) the episode shares with the other members of
            its tree, the root's turns before the branch point; empty for an episode played
            on its own. Training credits them apart (`toolgym.algorithms.tree_credit`).

    `prompt_ids`, `completion_ids`, `loss_mask` and `logprobs` read the last sample's.
    """

    samples: list[Sample] = field(default_factory=lambda: [Sample([])])
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = 0.0
    reward_sources: dict[str, float | None] = field(default_factory=dict)
    status: Status = "finished"
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    step_rewards: list[dict[str, float]] = field(default_factory=list)
    env_metrics: dict[str, float] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    role_rewards: dict[str, float] = field(default_factory=dict)
    judgements: list[dict[str, Any]] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.samples or not all(isinstance(s, Sample) for s in self.samples):
            raise TypeError("Trajectory(samples=...) takes a non-empty list of Sample")

    @property
    def prompt_ids(self) -> list[int]:
        """The last sample's prompt (the first prompt, for a one-sequence episode)."""
        return self.samples[-1].prompt_ids

    @property
    def completion_ids(self) -> list[int]:
        """The last sample's model and observation tokens."""
        return self.samples[-1].completion_ids

    @property
    def loss_mask(self) -> list[int]:
        """The last sample's loss mask (1 on sampled tokens, 0 on observation tokens)."""
        return self.samples[-1].loss_mask

    @property
    def logprobs(self) -> list[float]:
        """The last sample's logprobs (0.0 on observation tokens)."""
        return self.samples[-1].logprobs

    @property
    def model_tokens(self) -> int:
        """The tokens the model sampled, over all samples (what the loss trains on)."""
        return sum(sum(sample.loss_mask) for sample in self.samples)

    @property
    def observation_tokens(self) -> int:
        """The tokens after the first prompt that the model did not sample: the unsampled
        tokens of every sample's completion (tool results, user turns), and where a sample
        continues its parent, what its prompt adds beyond the parent's sequence (for per-turn
        samples the template's rendering between turns; a compacted prompt, shorter than its
        parent's sequence, adds nothing)."""
        count = 0
        for sample in self.samples:
            count += len(sample.completion_ids) - sum(sample.loss_mask)
            if sample.parent is not None:
                parent = self.samples[sample.parent]
                parent_length = len(parent.prompt_ids) + len(parent.completion_ids)
                count += max(0, len(sample.prompt_ids) - parent_length)
        return count

    def append(
        self,
        ids: list[int],
        sampled: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        """Append model tokens (`sampled=True`, with their logprobs and weights versions) or
        observation tokens to the last sample."""
        self.samples[-1].append(ids, sampled, logprobs, versions)

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat template should render them to reproduce the tokens.

        Assistant turns carry the parsed `content`, `reasoning_content` and `tool_calls` for
        readers and reward functions, and `raw_content`, the text the model wrote. This view
        renders each assistant turn as that raw text alone (the template must not write the
        calls a second time).
        """
        return [
            {"role": "assistant", "content": m.get("raw_content", m["content"])}
            if m["role"] == "assistant"
            else m
            for m in self.messages
        ]

    @property
    def failed(self) -> bool:
        """True for infrastructure failures, which a trainer leaves out of baselines and loss
        (never for what the model caused: see `Status`)."""
        return self.status in INFRASTRUCTURE_FAILURES

    @property
    def ended_by_failure(self) -> bool:
        """True when a failure ended the episode, the model's or the infrastructure's (its
        environment may be gone: nothing more is read from it)."""
        return self.status in INFRASTRUCTURE_FAILURES or self.status in MODEL_FAILURES

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (see `from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """The trajectory `to_dict` wrote, also in the format before `samples` (flat
        `prompt_ids`, `completion_ids`, `loss_mask`, `logprobs`, and per-turn episodes'
        `turns`, whose masks were all ones; an unused `rewards`)."""
        data = dict(data)
        if "samples" in data:
            data["samples"] = [
                Sample(**{"parent": index - 1 if index else None, **sample})
                for index, sample in enumerate(data["samples"])
            ]  # samples written before `parent` were one chain of turns
        else:
            flat_fields: dict[str, Any] = {
                name: data.pop(name, None) or [] for name in SAMPLE_FIELDS
            }
            flat = Sample(**flat_fields)
            turns = [
                Sample(
                    t["prompt_ids"],
                    t["completion_ids"],
                    [1] * len(t["completion_ids"]),
                    t["logprobs"],
                )
                for t in data.pop("turns", None) or []
            ]
            for index, turn in enumerate(turns[1:]):
                turn.parent = index
            data["samples"] = turns or [flat]
        legacy = data.pop("rewards", None)
        data.setdefault("reward_sources", dict(legacy or {}))
        return cls(**data)


def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path, append: bool = False) -> None:
    """Write one JSON object per line (after what the file holds when `append`)."""
    # backslashreplace: a lone surrogate in some text (never from toolgym's own rendering)
    # must not lose the run's samples
    with Path(path).open(
        "a" if append else "w", encoding="utf-8", errors="backslashreplace"
    ) as file:
        for trajectory in trajectories:
            file.write(json.dumps(trajectory.to_dict(), ensure_ascii=False, default=str) + "\n")


def load_jsonl(path: str | Path) -> list[Trajectory]:
    """The trajectories `save_jsonl` wrote, in order."""
    with Path(path).open(encoding="utf-8") as file:
        return [Trajectory.from_dict(json.loads(line)) for line in file if line.strip()]


def outcome(trajectory: Trajectory) -> dict[str, Any]:
    """What `summarize` needs of one episode (small: trainers gather these across processes)."""
    metrics = trajectory.metrics
    row = trajectory.row if isinstance(trajectory.row, dict) else {}
    return {
        "reward": trajectory.reward,
        "status": trajectory.status,
        "turns": metrics["turns"],
        "tool_calls": metrics["tool_calls"],
        "tool_failures": metrics["tool_failures"],
        "env_metrics": trajectory.env_metrics,
        "env_name": row.get("env"),
        "difficulty": row.get("difficulty"),
    }


def summarize(
    episodes: Iterable[Trajectory | dict[str, Any]], success_threshold: float = 1.0
) -> dict[str, Any]:
    """Figures of finished episodes (trajectories, or their `outcome`s): their count, mean
    reward, success rate (reward at least `success_threshold`), mean turns, tool calls, failed
    and valid tool calls per episode, how many ended with each status, under `env` the
    mean of each of the environment's episode metrics (over the episodes that report it), and
    per environment and per declared `difficulty` their reward and success rate."""
    rows = [outcome(e) if isinstance(e, Trajectory) else e for e in episodes]
    if not rows:
        raise ValueError("no episodes to summarize")
    rewards = [row["reward"] or 0.0 for row in rows]  # no reward counts 0, as in training
    return {
        "episodes": len(rows),
        "reward": statistics.fmean(rewards),
        "success_rate": statistics.fmean(r >= success_threshold for r in rewards),
        "turns": statistics.fmean(row["turns"] for row in rows),
        "tool_calls": statistics.fmean(row["tool_calls"] for row in rows),
        "tool_failures": statistics.fmean(row["tool_failures"] for row in rows),
        "valid_tool_calls": statistics.fmean(
            row["tool_calls"] - row["tool_failures"] for row in rows
        ),
        "statuses": dict(Counter(row["status"] for row in rows)),
        "env": mean_env_metrics(row.get("env_metrics") or {} for row in rows),
        **_per_environment(rows, success_threshold),
        **_per_difficulty(rows, success_threshold),
    }


def _per_difficulty(rows: list[dict[str, Any]], success_threshold: float) -> dict[str, float]:
    """`difficulty/<value>/reward`, `.../success_rate` and `.../episodes` for each difficulty
    the episodes' rows declare (a curriculum's levels, `toolgym.algorithms.curriculum`)."""
    by_level: dict[float, list[float]] = {}
    for row in rows:
        if isinstance(row.get("difficulty"), int | float):
            by_level.setdefault(float(row["difficulty"]), []).append(row["reward"] or 0.0)
    figures: dict[str, float] = {}
    for level, rewards in sorted(by_level.items()):
        name = f"difficulty/{level:g}"
        figures[f"{name}/reward"] = statistics.fmean(rewards)
        figures[f"{name}/success_rate"] = statistics.fmean(r >= success_threshold for r in rewards)
        figures[f"{name}/episodes"] = len(rewards)
    return figures


def _per_environment(rows: list[dict[str, Any]], success_threshold: float) -> dict[str, float]:
    """`envs/<name>/reward`, `.../success_rate` and `.../episodes` for each environment of a
    run that plays several (the `env` each episode's row names); nothing for one."""
    by_name: dict[str, list[float]] = {}
    for row in rows:
        if isinstance(row.get("env_name"), str):
            by_name.setdefault(row["env_name"], []).append(row["reward"] or 0.0)
    figures: dict[str, float] = {}
    for name, rewards in sorted(by_name.items()):
        figures[f"envs/{name}/reward"] = statistics.fmean(rewards)
        figures[f"envs/{name}/success_rate"] = statistics.fmean(
            r >= success_threshold for r in rewards
        )
        figures[f"envs/{name}/episodes"] = len(rewards)
    return figures


def mean_env_metrics(episodes: Iterable[dict[str, float]]) -> dict[str, float]:
    """The mean of each named episode metric over the episodes that report it, by name."""
    values: dict[str, list[float]] = {}
    for metrics in episodes:
        for name, value in metrics.items():
            values.setdefault(name, []).append(value)
    return {name: statistics.fmean(v) for name, v in values.items()}
