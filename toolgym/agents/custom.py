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

import abc
import asyncio
import copy
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from toolgym.agents.engines.base import Completion, SamplingParams
from toolgym.agents.images import tool_images
from toolgym.agents.inline import observation_ids
from toolgym.agents.parsers import ParsedMessage, type_arguments
from toolgym.agents.subagents import step_with_subagents
from toolgym.agents.trajectory import Sample, Status, Trajectory
from toolgym.envs.calls import INVALID_CALLS, MalformedToolCall, ToolCall, as_call_list
from toolgym.envs.tools import valid_text

if TYPE_CHECKING:
    from toolgym.agents.chat import ChatRenderer
    from toolgym.agents.limits import AgentLimits
    from toolgym.envs.calls import StepResult
    from toolgym.envs.inline import InlineStep


@dataclass
class Generation:
    """One `RolloutContext.generate` call's outcome (its tokens are already appended)."""

    text: str
    """The sampled text, without a final end-of-turn token."""
    finish_reason: Literal["stop", "length"]
    ended_turn: bool
    """The model ended its turn (an end-of-turn or end-of-text token)."""
    last_token: int | None = None
    """The last sampled token id (which stop token ended the turn), None if none."""


@dataclass(frozen=True)
class EpisodeContext:
    """Where an episode stands, for another to go on from (`RolloutContext.context`)."""

    trajectory: Trajectory
    view: list[dict[str, Any]] | None
    first_prompt_length: int | None
    carried: int
    metrics: dict[str, float]


class EpisodeEnd(Exception):
    """Raise from a rollout function to end the episode with `status` (e.g. "env_done")."""

    def __init__(self, status: Status, error: BaseException | str | None = None) -> None:
        super().__init__(status)
        self.status, self.error = status, error


class RolloutContext(abc.ABC):
    """What a rollout function gets besides the environment: the prompt, the tools, and
    helpers that keep exact tokens, masks, limits and metrics. The built-in protocols (the
    chat tool-call loop and the inline protocol, `toolgym.agents.rollout_functions`) use only these.

    The context *is* the episode being played (`toolgym.agents.rollout.Episode`, which
    implements the engine and environment calls under the agent's limits): nothing here
    reaches for another object's state.

    Attributes:
        agent: The `Agent` playing the episode (its engine, tokenizer, parser, template).
        env: The environment being played.
        limits: The episode's limits.
        sampling: This run's sampling settings (temperature and top-p; greedy in an
            evaluation).
        metrics: The episode's counters (turns, tool calls, failures, seconds, ...).
        messages: The row's prompt with `reset()`'s observation appended (chat messages).
        tools: The environment's tool schemas.
        trajectory: The trajectory `start` made last (the one a failure status goes to).
        hit_length: The last `generate` stopped at `max_new_tokens` (the episode then ends
            `length`).
    """

    agent: Any  # the `toolgym.agents.rollout.Agent` (a type import would be a cycle)
    env: Any
    limits: AgentLimits
    sampling: SamplingParams
    metrics: dict[str, float]
    on_message: Callable[[dict[str, Any]], None]
    first_prompt_length: int | None
    _row: dict[str, Any]
    _reward: float | None

    def _open(self, messages: list[dict[str, Any]], subagents: bool = True) -> None:
        """Start the rollout function's view of the episode from its first messages; the
        agent's sub-agents join the tools unless not `subagents` (a sub-episode's)."""
        self.messages = messages
        self.tools: list[dict[str, Any]] = list(self.env.tools)
        self._subagents = {s.name: s for s in self.agent.subagents} if subagents else {}
        self._side: list[tuple[int, Trajectory, str]] = []  # (spawning sample, episode, role)
        clash = sorted(set(self._subagents) & {t["function"]["name"] for t in self.tools})
        if clash:
            raise ValueError(
                f"the sub-agent tool {clash[0]!r} has the name of a tool of the environment"
            )
        self.tools += [subagent.schema() for subagent in self._subagents.values()]
        self.trajectory: Trajectory | None = None
        self.hit_length = False
        self._told = False  # the prompt went to `on_message`
        self._turn: tuple[int, int] | None = None  # (sample, start) of the model's last turn
        self._stepped = True  # a `step` ran since the last `generate`: the next opens a turn
        self._view: list[dict[str, Any]] | None = None  # the conversation as compacted
        self._carried = 0  # tokens the episode used before the last `continue_from`

    # -- what the episode implements: the engine and environment under the limits ----------
    @abc.abstractmethod
    def tokens_left(self, trajectory: Trajectory) -> int:
        """Tokens the next turn may still add to `trajectory`."""

    @abc.abstractmethod
    async def _complete(self, trajectory: Trajectory, stop_strings: list[str] | None) -> Completion:
        """A completion continuing `trajectory` under the episode's limits (not appended)."""

    @abc.abstractmethod
    def decode(self, completion: Completion) -> str:
        """A completion's text without its final stop token."""

    @abc.abstractmethod
    async def _call_tools(self, calls: Any) -> StepResult:
        """The environment's step on one turn's calls, under the tool limits."""

    @abc.abstractmethod
    async def _env_final_answer(self, text: str) -> None:
        """The environment's `final_answer`, under the tool limits."""

    @abc.abstractmethod
    async def _env_inline_step(self, text: str) -> InlineStep:
        """The environment's `inline_step`, under the tool limits."""

    @abc.abstractmethod
    async def _env_user_turn(self, answer: str) -> str | None:
        """The environment's `user_turn`, under the tool limits."""

    @abc.abstractmethod
    async def _play_subepisode(self, env: Any, row: dict[str, Any]) -> Trajectory:
        """Another episode of `env` from `row`, with this episode's agent, engine and
        sampling, without sub-agents of its own (its trajectory; never raises)."""

    # -- the rollout function's view ---------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The agent's tokenizer."""
        return self.agent.tokenizer

    @property
    def renderer(self) -> ChatRenderer:
        """The agent's chat renderer (template, end-of-turn and stop tokens)."""
        return self.agent.renderer

    @property
    def vision(self) -> Any:
        """How the agent's model sees images in tool results (None: text only)."""
        return self.agent.vision

    @property
    def row(self) -> dict[str, Any]:
        """The dataset row the environment was reset with (without its prompt)."""
        return dict(self._row)

    @property
    def reward(self) -> float | None:
        """A score for the episode the rollout function gives itself (set it); None: the
        environment's `get_reward()` scores it."""
        return self._reward

    @reward.setter
    def reward(self, value: float | None) -> None:
        self._reward = None if value is None else float(value)

    def adopt(self, trajectory: Trajectory, turns: int) -> None:
        """Take a trajectory made elsewhere (an endpoint's recording) as the episode's, with
        the generations it took (what `max_turns` counts); failures end it."""
        self.trajectory = trajectory
        self.metrics["turns"] = float(turns)

    def context(self) -> EpisodeContext:
        """A copy of where the episode stands (its trajectory, the model's view, counters),
        for another episode to go on from (`resume`), e.g. a branch of a tree rollout on a
        fork of the environment."""
        if self.trajectory is None:
            raise RuntimeError("context() before start(): the episode has no trajectory yet")
        return EpisodeContext(
            copy.deepcopy(self.trajectory),
            copy.deepcopy(self._view),
            self.first_prompt_length,
            self._carried,
            dict(self.metrics),
        )

    def resume(self, context: EpisodeContext) -> Trajectory:
        """Go on from `context` (another episode's, whose messages this one's row gave as its
        prompt): its trajectory (a copy), view and counters become this episode's; returns the
        trajectory. The next generation opens a new turn."""
        trajectory = copy.deepcopy(context.trajectory)
        self.trajectory, self._view = trajectory, copy.deepcopy(context.view)
        self.first_prompt_length, self._carried = context.first_prompt_length, context.carried
        self.metrics.update(context.metrics)  # counters added on the way too (compactions)
        self._told, self._stepped = True, True
        return trajectory

    @property
    def turns(self) -> int:
        """Generations so far (what `max_turns` counts)."""
        return int(self.metrics["turns"])

    def start(
        self,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        role: str = "policy",
    ) -> Trajectory:
        """A trajectory whose prompt is the chat template's rendering of `messages` (default:
        `self.messages`) with `tools` (default: none), ending with the generation prompt.
        The trajectory holds one sample (played by `role`); `next_turn` or `continue_from`
        starts another. The first call tells `on_message` of the prompt."""
        messages = list(self.messages if messages is None else messages)
        prompt_ids = self.renderer.prompt_ids(messages, tools or [])
        self.trajectory = Trajectory([Sample(prompt_ids, role=role)], messages=messages)
        self.first_prompt_length = len(prompt_ids)
        self._view, self._carried = None, 0
        if not self._told:
            self._told = True
            for message in messages:
                self.on_message(message)
        return self.trajectory

    def next_turn(
        self,
        trajectory: Trajectory,
        tools: list[dict[str, Any]] | None = None,
        role: str | None = None,
    ) -> None:
        """Start the trajectory's next sample (one sample per turn), its `parent` the last
        and its `role` the last's unless given: its prompt is the template's rendering of the
        conversation so far as the model sees it (`visible_messages`), with every tool
        result's image in it where the model sees images."""
        self._new_sample(trajectory, self.visible_messages(trajectory), tools or [], role)

    def visible_messages(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        """The conversation as the model sees it: `trajectory.messages`, or, once it was
        compacted (`continue_from`), the compacted conversation and what came after."""
        if self._view is not None and trajectory is self.trajectory:
            return list(self._view)
        return list(trajectory.messages)

    def continue_from(
        self,
        trajectory: Trajectory,
        messages: list[dict[str, Any]],
        keep_view: bool = False,
        used: int | None = None,
        role: str | None = None,
    ) -> None:
        """Continue the episode in a new sample (its `parent` the last) whose prompt is the
        template's rendering of `messages`, the conversation as the model now sees it (e.g.
        compacted: `toolgym.agents.compaction`); messages added later join that view. With
        `keep_view`, the view stays as it was (a side turn, such as a summary request, whose
        messages are added with `visible=False`). The token budget counts on from what the
        episode used (`used`, default `tokens_used` now). The new sample is played by `role`
        (default: the last sample's), e.g. a solver after a proposer, with the roles scored
        apart in `Trajectory.role_rewards`."""
        used = self.tokens_used(trajectory) if used is None else used
        self._new_sample(trajectory, messages, self.tools, role)
        self._carried, self.first_prompt_length = used, len(trajectory.prompt_ids)
        if not keep_view:
            self._view = list(messages)
        self._stepped = True  # the next generation opens a turn in the new sample

    def tokens_used(self, trajectory: Trajectory) -> int:
        """Tokens the episode added after its first prompt (model and observation), over
        all its samples."""
        length = len(trajectory.prompt_ids) + len(trajectory.completion_ids)
        return self._carried + length - (self.first_prompt_length or len(trajectory.prompt_ids))

    def _new_sample(
        self,
        trajectory: Trajectory,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        role: str | None = None,
    ) -> None:
        images = tool_images(messages) if self.vision is not None else []
        try:
            prompt_ids = self.renderer.prompt_ids(messages, tools)
            if self.vision is not None:  # one placeholder per image so far, widened
                prompt_ids = self.vision.expand(prompt_ids, images)
        except Exception as error:
            raise EpisodeEnd("env_error", f"the chat template cannot render: {error}") from error
        parent = len(trajectory.samples) - 1
        role = trajectory.samples[-1].role if role is None else role
        trajectory.samples.append(Sample(prompt_ids, images=images, parent=parent, role=role))

    async def compact(self, trajectory: Trajectory) -> bool:
        """Compact the conversation where the agent's `Compaction` says so (its budget is
        passed and something can be dropped): the episode goes on in a new sample. True if
        it did; False without a `Compaction`."""
        compaction = self.agent.compaction
        return False if compaction is None else await compaction.apply(self, trajectory)

    async def generate(
        self, trajectory: Trajectory, stop_strings: list[str] | None = None
    ) -> Generation:
        """Sample a continuation of `trajectory` and append it (mask 1, with logprobs).

        Generation ends at an end-of-turn token, one of `stop_strings`, or the per-call
        `max_new_tokens`. Raises `EpisodeEnd("max_turns")` past `AgentLimits.max_turns`
        calls and `EpisodeEnd("length")` when the token budget is spent."""
        if self.turns >= self.limits.max_turns:
            raise EpisodeEnd("max_turns")
        completion = await self._complete(trajectory, stop_strings)
        self.metrics["turns"] += 1
        if self._stepped:  # the first generation since the last step opens the model's turn
            self._turn = (len(trajectory.samples) - 1, len(trajectory.completion_ids))
            self._stepped = False
        trajectory.append(
            completion.token_ids, True, completion.logprobs, completion.versions or None
        )
        self.hit_length = completion.finish_reason == "length"
        last = completion.token_ids[-1] if completion.token_ids else None
        ended = completion.finish_reason == "stop" and last in self.renderer.profile.stop_token_ids
        return Generation(self.decode(completion), completion.finish_reason, ended, last)

    def observe(self, trajectory: Trajectory, text: str) -> None:
        """Append `text` as tokens the model did not sample (mask 0), tokenized on their own
        and checked to decode exactly after what precedes them. Raises `EpisodeEnd("length")`
        if they do not fit."""
        ids, exact = observation_ids(self.tokenizer, trajectory.completion_ids, text)
        self.metrics["inexact_observations"] += not exact
        self.observe_ids(trajectory, ids)

    def observe_ids(self, trajectory: Trajectory, ids: list[int]) -> None:
        """Append token ids the model did not sample (mask 0), e.g. a template's rendering of
        tool results. Raises `EpisodeEnd("length")` if they do not fit."""
        if self.tokens_left(trajectory) < len(ids):
            raise EpisodeEnd("length")
        trajectory.append(ids, sampled=False)

    def add_message(
        self, trajectory: Trajectory, message: dict[str, Any], visible: bool = True
    ) -> None:
        """Add a message to the trajectory's conversation and tell `on_message` of it; it
        joins the model's compacted view too, unless not `visible` (a side turn)."""
        trajectory.messages.append(message)
        if visible and self._view is not None and trajectory is self.trajectory:
            self._view.append(message)
        self.on_message(message)

    async def parse(self, text: str) -> ParsedMessage:
        """The tool calls in `text`, typed by the tools' schemas, each with an id; parsed off
        the event loop (a long hostile message must not stall the other episodes). A parser
        that raises (a user's own) makes the text one malformed call, never ends the run."""
        parsed = await asyncio.to_thread(self._parse, text)
        self.metrics["parse_failures"] += parsed.failures
        turn = max(self.turns - 1, 0)
        for index, call in enumerate(parsed.tool_calls):
            if call.id is None:  # 9 letters and digits: Mistral's templates require that shape
                call.id = f"c{turn:04d}{index:04d}"
        return parsed

    def _parse(self, text: str) -> ParsedMessage:
        try:
            return type_arguments(self.agent.parse(text), self.tools)
        except TimeoutError:
            raise  # a caller's time limit, not the text's doing
        except Exception as error:
            reason = f"the parser failed ({type(error).__name__}: {error})"
            return ParsedMessage(text.strip(), [MalformedToolCall(text, reason)])

    async def step(self, tool_calls: Any, trajectory: Trajectory | None = None) -> StepResult:
        """Run one turn's tool calls on the environment under the agent's limits: a call
        past `tool_call_timeout` or a turn past `tool_timeout` ends the episode with
        `tool_timeout`, a call that kills its sandbox worker with `tool_crash`, more than
        `max_tool_calls_per_turn` calls with `too_many_calls`, an environment failure with
        `env_error` (each raises `EpisodeEnd`). With `trajectory`, the results' messages join
        its conversation first (also those of a failed call).

        The step's reward (`StepResult.reward`: the change of the environment's reward) joins
        the `step_rewards` of `trajectory` (default: `self.trajectory`) with the span of the
        model's turn that made the calls (`record_turn_reward`), where the environment reports
        per-step rewards (`reward_per_step`; a plain class's reward, read once at the end, is
        the episode's, not a turn's). Each call refused before any tool ran (`INVALID_CALLS`)
        adds `AgentLimits.invalid_call_reward` to the turn's step rewards, outside the
        environment's reward (`in_reward` 0)."""
        target = trajectory if trajectory is not None else self.trajectory
        calls = as_call_list(tool_calls)
        if any(isinstance(c, ToolCall) and c.name in self._subagents for c in calls):
            limit = self.limits.max_tool_calls_per_turn
            if len(calls) > limit:
                raise EpisodeEnd(
                    "too_many_calls",
                    f"{len(calls)} tool calls in one turn; at most {limit} "
                    "(AgentLimits.max_tool_calls_per_turn)",
                )
            step = await step_with_subagents(self, calls, target)
        else:
            step = await self._call_tools(calls)
        if target is not None and getattr(self.env, "reward_per_step", True):
            record_turn_reward(target, step.reward, self._turn)
        if target is not None and self.limits.invalid_call_reward:
            failures = step.info.get("failures", ())
            invalid = sum(f.get("kind") in INVALID_CALLS for f in failures)
            penalty = invalid * self.limits.invalid_call_reward
            record_turn_reward(target, penalty, self._turn, in_reward=False)
        self._stepped = True
        if trajectory is not None:
            for message in step.messages:
                self.add_message(trajectory, message)
        end_if_failed(step)
        return step

    async def user_turn(self, trajectory: Trajectory, answer: str, last_token: int | None) -> bool:
        """After the model's `answer` without tool calls (its turn ended on `last_token`), ask
        the environment whether the user speaks again (`Environment.user_turn`). If so, the
        user's message joins the conversation and its tokens the trajectory (mask 0): in one
        sequence, after the model's last token, as the template writes a user turn
        (`ChatRenderer.user_turn_ids`); where that would not be exact (the template writes
        earlier turns differently once a user follows them, or the answer ended on an
        end-of-text token), in a new sample rendered from the whole conversation (its
        `parent` the last); in per-turn episodes the next turn's prompt holds it. True: the
        model takes another turn; False: the user is done (hand the answer to
        `final_answer`). Failures end the episode as for `step`."""
        text = await self._env_user_turn(answer)
        if text is None:
            return False
        message = {"role": "user", "content": valid_text(text)}
        self.add_message(trajectory, message)
        self._stepped = True  # the next generation opens the model's next turn
        profile = self.renderer.profile
        if profile.per_turn:
            return True  # the next turn's prompt is the template's rendering of it all
        try:
            suffix = self.renderer.user_turn_ids(message, last_token, self.tools)
        except Exception as error:
            raise EpisodeEnd("env_error", f"the chat template cannot render: {error}") from error
        if suffix is None:
            self.next_turn(trajectory, self.tools)  # one sequence would not be exact here
        else:
            self.observe_ids(trajectory, suffix)
        return True

    async def final_answer(self, text: str) -> None:
        """Hand the model's final text to the environment's `final_answer` (under the tool
        limits, failures ending the episode as for `step`)."""
        await self._env_final_answer(text)

    async def inline_step(self, trajectory: Trajectory, text: str) -> InlineStep:
        """The environment's `inline_step` on the text the model wrote up to a marker; its
        reward joins `trajectory.step_rewards` at the current end of the last sample."""
        step = await self._env_inline_step(text)
        trajectory.step_rewards.append(
            {"end": len(trajectory.completion_ids), "reward": step.reward}
        )
        return step


def assistant_message(text: str, parsed: ParsedMessage) -> dict[str, Any]:
    """The assistant turn as a chat message: its content without reasoning or call markup (the
    raw text where a call was malformed), its reasoning (`reasoning_content`, when it wrote
    any), its calls (a malformed one as `invalid_tool_call`, which its error result answers, so
    that templates can render the conversation), and the text as sampled (`raw_content`)."""
    calls = [
        {
            "type": "function",
            "id": call.id,
            "function": {"name": call.name, "arguments": call.arguments}
            if isinstance(call, ToolCall)
            else {"name": "invalid_tool_call", "arguments": {}},
        }
        for call in parsed.tool_calls
    ]
    content = text if parsed.failures else parsed.content  # a malformed call stays visible
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": calls}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    message["raw_content"] = text
    return message


def record_turn_reward(
    trajectory: Trajectory,
    reward: float | None,
    turn: tuple[int, int] | None,
    in_reward: bool = True,
) -> None:
    """Keep a tool call's step reward in `trajectory.step_rewards` with the model's turn that made
    the call: `sample` (its index in `trajectory.samples`), `start` and `end` (the turn's tokens in
    that sample's `completion_ids`: `turn` is (sample, start) of the turn, the end is the sample's
    current end) and `in_reward` (1: the environment's reward already holds it, `StepResult.reward`
    being its change; 0 with `in_reward=False`: a reward from outside the environment, such as
    `AgentLimits.invalid_call_reward`). A reward of 0, None or not finite records nothing (it would
    credit nothing). A turn in an earlier sample (or none) starts at 0."""
    if reward is None or not math.isfinite(reward) or reward == 0:
        return
    sample = len(trajectory.samples) - 1
    end = len(trajectory.completion_ids)
    start = min(turn[1], end) if turn is not None and turn[0] == sample else 0
    trajectory.step_rewards.append(
        {
            "sample": sample,
            "start": start,
            "end": end,
            "reward": float(reward),
            "in_reward": int(in_reward),
        }
    )


def end_if_failed(step: Any) -> None:
    """Raise `EpisodeEnd` with the status of a failure that ended the episode during a step
    (`StepResult.info["ended"]`: a call past its time limit, a sandbox worker the call
    killed, an executor that failed), after its messages were kept."""
    ended = step.info.get("ended")
    if ended:
        raise EpisodeEnd(ended, step.info.get("error"))


RolloutFn = Callable[[RolloutContext, Any], Awaitable[Trajectory]]
"""`async def fn(ctx: RolloutContext, env) -> Trajectory`."""
