"""User rollout functions: episodes that neither the chat nor the inline protocol covers
(several model calls with different prompts, a planner and an executor, self-verification).

    async def plan_then_act(ctx: RolloutContext, env) -> Trajectory:
        trajectory = ctx.start()                         # the row's prompt, rendered
        plan = await ctx.generate(trajectory, stop_strings=["</plan>"])
        ctx.observe(trajectory, "\\nNow act on the plan.\\n")  # unsampled tokens (mask 0)
        answer = await ctx.generate(trajectory)
        env.final_answer(answer.text)
        return trajectory

    agent.run(envs, rows, rollout_fn=plan_then_act)   # or GRPOTrainer(..., rollout_fn=...)

Everything goes through the episode's own machinery: requests join the agent's batches (or
the engine's continuous batching), `AgentLimits` apply (`max_turns` counts `generate` calls,
the token budget and the context length count every token), tokens are never re-tokenized,
and failures end the episode with the usual statuses: a limit gives `length` (also when the
last `generate` stopped at `max_new_tokens`) or `max_turns`, tool calls past their time
limits `tool_timeout`, a call that kills its sandbox worker `tool_crash`, too many calls in
one `step` `too_many_calls` (the model's outcomes, in the loss), the engine `engine_error`,
and an exception in the function or the environment `env_error`. The episode's reward is the
environment's `get_reward()` after the function returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from toolgym.agents.inline import observation_ids
from toolgym.agents.trajectory import Status, Trajectory

if TYPE_CHECKING:
    from toolgym.envs.calls import StepResult


@dataclass
class Generation:
    """One `RolloutContext.generate` call's outcome (its tokens are already appended)."""

    text: str
    """The sampled text, without a final end-of-turn token."""
    finish_reason: Literal["stop", "length"]
    ended_turn: bool
    """The model ended its turn (an end-of-turn or end-of-text token)."""


class EpisodeEnd(Exception):
    """Raise from a rollout function to end the episode with `status` (e.g. "env_done")."""

    def __init__(self, status: Status, error: BaseException | str | None = None) -> None:
        super().__init__(status)
        self.status, self.error = status, error


class RolloutContext:
    """What a rollout function gets besides the environment: the prompt, the tools, and
    helpers that keep exact tokens and masks.

    Attributes:
        messages: The row's prompt with `reset()`'s observation appended (chat messages).
        tools: The environment's tool schemas.
        trajectory: The trajectory `start` made last (the one a failure status goes to).
    """

    def __init__(self, episode: Any, messages: list[dict[str, Any]]) -> None:
        self._episode = episode  # the `rollout.Episode` being played (not imported: no cycle)
        self.messages = messages
        self.tools: list[dict[str, Any]] = episode.env.tools
        self.trajectory: Trajectory | None = None
        self.hit_length = False
        """The last `generate` stopped at `max_new_tokens` (the episode then ends `length`)."""

    @property
    def tokenizer(self) -> Any:
        """The agent's tokenizer."""
        return self._episode.agent.tokenizer

    def start(
        self,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Trajectory:
        """A trajectory whose prompt is the chat template's rendering of `messages` (default:
        `self.messages`) with `tools` (default: none), ending with the generation prompt."""
        messages = list(self.messages if messages is None else messages)
        prompt_ids = self._episode.agent.renderer.prompt_ids(messages, tools or [])
        self.trajectory = Trajectory(prompt_ids, messages=messages)
        self._episode.first_prompt_length = len(prompt_ids)
        return self.trajectory

    async def generate(
        self, trajectory: Trajectory, stop_strings: list[str] | None = None
    ) -> Generation:
        """Sample a continuation of `trajectory` and append it (mask 1, with logprobs).

        Generation ends at an end-of-turn token, one of `stop_strings`, or the per-call
        `max_new_tokens`. Raises `EpisodeEnd("max_turns")` past `AgentLimits.max_turns`
        calls and `EpisodeEnd("length")` when the token budget is spent."""
        episode = self._episode
        if episode.metrics["turns"] >= episode.limits.max_turns:
            raise EpisodeEnd("max_turns")
        completion = await episode.generate(trajectory, stop_strings)
        episode.metrics["turns"] += 1
        trajectory.append(completion.token_ids, sampled=True, logprobs=completion.logprobs)
        self.hit_length = completion.finish_reason == "length"
        stops = episode.agent.renderer.stop_token_ids
        ended = (
            completion.finish_reason == "stop"
            and completion.token_ids[-1:] != []
            and (completion.token_ids[-1] in stops)
        )
        return Generation(episode.decode(completion), completion.finish_reason, ended)

    def observe(self, trajectory: Trajectory, text: str) -> None:
        """Append `text` as tokens the model did not sample (mask 0), tokenized on their own
        and checked to decode exactly after what precedes them. Raises `EpisodeEnd("length")`
        if they do not fit."""
        episode = self._episode
        ids, exact = observation_ids(self.tokenizer, trajectory.completion_ids, text)
        episode.metrics["inexact_observations"] += not exact
        if episode.room(trajectory) < len(ids):
            raise EpisodeEnd("length")
        trajectory.append(ids, sampled=False)

    async def step(self, tool_calls: Any) -> StepResult:
        """Run one turn's tool calls on the environment under the agent's limits: a call
        past `tool_call_timeout` or a turn past `tool_timeout` ends the episode with
        `tool_timeout`, a call that kills its sandbox worker with `tool_crash`, more than
        `max_tool_calls_per_turn` calls with `too_many_calls`, an environment failure with
        `env_error` (each raises `EpisodeEnd`)."""
        step = await self._episode.call_tools(tool_calls)
        end_if_failed(step)
        return step


def end_if_failed(step: Any) -> None:
    """Raise `EpisodeEnd` with the status of a failure that ended the episode during a step
    (`StepResult.info["ended"]`: a call past its time limit, a sandbox worker the call
    killed, an executor that failed), after its messages were kept."""
    ended = step.info.get("ended")
    if ended:
        raise EpisodeEnd(ended, step.info.get("error"))


RolloutFn = Callable[[RolloutContext, Any], Awaitable[Trajectory]]
"""`async def fn(ctx: RolloutContext, env) -> Trajectory`."""
