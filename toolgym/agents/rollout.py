"""The episode scheduler: many episodes in flight, no lock-step turns.

Every episode is its own asyncio task. When an episode needs the model, it queues a request;
the batcher sends the pending requests to the engine as one batch (in a worker thread, so tools
keep running meanwhile) once every live episode is waiting for the model or after a short
window (`Agent.batch_wait`). Tools run through `env.astep`, so a slow tool holds
back only its own episode.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from toolgym.agents.chat import ChatRenderer, TemplateProfile
from toolgym.agents.compaction import Compaction
from toolgym.agents.custom import EpisodeEnd, RolloutContext, RolloutFn
from toolgym.agents.engines.base import (
    Completion,
    Engine,
    GenerationRequest,
    PerRequestEngine,
    SamplingParams,
    capabilities,
    completion_seed,
)
from toolgym.agents.limits import AgentLimits
from toolgym.agents.parsers import Parser, get_parser
from toolgym.agents.rollout_functions import chat_rollout, inline_rollout
from toolgym.agents.subagents import SubAgent, join_side_samples
from toolgym.agents.trajectory import MODEL_FAILURES, Status, Trajectory
from toolgym.envs.calls import (
    as_call_list,
    as_episode_metrics,
    run_coroutine,
)
from toolgym.envs.inline import InlineStep
from toolgym.envs.stepping import (
    Steppable,
    as_environment,
    failure_status,
    trl_shaped,
)
from toolgym.envs.time_limits import ReadTimedOut, within
from toolgym.envs.tools import valid_text

if TYPE_CHECKING:
    from toolgym.agents.images import VisionInputs

Row = dict[str, Any]
T = TypeVar("T")


class RequestBatcher:
    """Collects generation requests into engine batches without lock-step turns.

    A batch goes to the engine as soon as every live episode is waiting for the model, or when
    the oldest pending request has waited `max_wait` seconds, whichever comes first: episodes
    whose tools return together share a batch, and a slow tool delays the others by at most
    `max_wait`.
    """

    def __init__(
        self, engine: Engine, max_wait: float = 0.01, thread: ThreadPoolExecutor | None = None
    ) -> None:
        self.engine, self.max_wait = engine, max_wait
        self.thread = thread  # where engine.generate runs; None: the loop's default executor
        self.live = 0  # episodes started and not yet ended
        self._pending: list[tuple[GenerationRequest, asyncio.Future[Completion]]] = []
        self._changed = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    def episode_started(self) -> None:
        """Count a live episode (a batch waits for every live one)."""
        self.live += 1

    def episode_ended(self) -> None:
        """Stop counting an episode; a batch that waited only for it leaves now."""
        self.live -= 1
        self._changed.set()

    async def generate(self, request: GenerationRequest) -> Completion:
        """The completion of `request`, generated in a batch with other pending requests."""
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._changed.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _gather_window(self) -> None:
        """Wait until all live episodes are pending or `max_wait` has passed."""
        deadline = asyncio.get_running_loop().time() + self.max_wait
        while len(self._pending) < self.live:
            self._changed.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return

    async def _drain(self) -> None:
        while self._pending:
            await self._gather_window()
            batch, self._pending = self._pending, []
            # a canonical order (threads finish resets and tools in any order): with a long
            # `max_wait` the same requests make the same batch, and so the same samples
            batch.sort(key=lambda item: (item[0].prompt_ids, item[0].sampling.max_tokens))
            try:
                requests = [r for r, _ in batch]
                completions = await asyncio.get_running_loop().run_in_executor(
                    self.thread, self.engine.generate, requests
                )
            except Exception as error:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), completion in zip(batch, completions, strict=True):
                if not future.done():
                    future.set_result(completion)


MessageHook = Callable[[int, dict[str, Any]], None]
"""`Agent.run`'s `on_message`: (episode index, message)."""


class PerRequest:
    """The scheduler for engines that take one request at a time (`submit`): each episode's
    request goes to the engine the moment it is ready, and the episode resumes the moment its
    own completion is done (vLLM in-process or a server batch them continuously)."""

    def __init__(self, engine: PerRequestEngine) -> None:
        self.engine = engine

    def episode_started(self) -> None:
        """Nothing to count: no request waits for another."""

    def episode_ended(self) -> None:
        """Nothing to count."""

    async def generate(self, request: GenerationRequest) -> Completion:
        """The completion of `request`."""
        return await asyncio.wrap_future(self.engine.submit(request))


@dataclass
class Agent:
    """A model that plays environments: tokenizer + parser + engine + limits.

    Args:
        engine: The generation backend.
        tokenizer: The model's tokenizer, with a tool-capable chat template.
        parser: A parser name (`"auto"`, `"hermes"`, ...) or a callable.
        limits: Per-episode limits.
        sampling: Temperature and top-p (max_tokens and stop ids are set per turn).
        chat_template: A chat template to use instead of the tokenizer's.
        per_turn: Build episodes one training sample per assistant turn (True), as one token
            sequence (False), or as the template allows (None: one sequence exactly when the
            template is prefix-preserving; see `ChatRenderer`).
        chat_template_kwargs: Extra variables for every rendering of the template, e.g.
            `{"enable_thinking": False}`; detection (`parser="auto"`) renders with them too.
        batch_wait: Longest time (seconds) a generation request waits for other episodes to
            join its batch (the "batch" scheduler); episodes still running tools after it are
            not waited for.
        scheduler: "continuous": every request goes to the engine on its own and its episode
            resumes as soon as it is done (engines with `submit`: vLLM, a vLLM server);
            "batch": pending requests go as one batch and wait for all of it (any engine);
            "auto": continuous where the engine can.
        tool_threads: Threads for sync tools and `reset` in `run` (with `arun`, they run in
            the caller's loop's default executor).
        vision: How the model sees images in tool results (`toolgym.agents.images`; the
            engine must take them: the transformers engine); None: text only, and a tool
            result with an image ends its episode `env_error`, naming why.
        template_profile: What the template needs and does, learned before by another agent
            of the same tokenizer and template variables (its `renderer.profile`): the
            renderer uses it instead of learning it again.
        compaction: Past a token budget, compact the conversation the model sees (drop or
            summarise earlier turns) and go on in a new sample (`toolgym.agents.compaction`);
            None: never (the episode ends `length` at its limits).
        subagents: Tools that hand a task to another episode of this agent, whose samples
            join the caller's trajectory with their own role (`toolgym.agents.subagents`).
    """

    engine: Engine
    tokenizer: Any
    parser: str | Parser = "auto"
    limits: AgentLimits = field(default_factory=AgentLimits)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chat_template: str | None = None
    per_turn: bool | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_wait: float = 0.01
    tool_threads: int = 64
    scheduler: Literal["auto", "continuous", "batch"] = "auto"
    vision: VisionInputs | None = None
    template_profile: TemplateProfile | None = None
    compaction: Compaction | None = None
    subagents: Sequence[SubAgent] = ()

    def __post_init__(self) -> None:
        self.renderer = ChatRenderer(
            self.tokenizer,
            self.chat_template,
            self.per_turn,
            profile=self.template_profile,
            **self.chat_template_kwargs,
        )
        template = {"chat_template": self.chat_template} if self.chat_template else {}
        self.parse: Parser = get_parser(
            self.parser, self.tokenizer, **template, **self.chat_template_kwargs
        )
        # One long-lived thread for the engine: torch keeps its thread pool warm there.
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="toolgym-engine")

    def default_rollout(self, env: Steppable) -> RolloutFn:
        """The rollout function an episode of `env` plays when none is given: the inline
        protocol for an environment with `inline_markers`, else the chat tool-call loop."""
        return inline_rollout if getattr(env, "inline_markers", None) else chat_rollout

    def run(
        self,
        envs: Sequence[Any],
        rows: Sequence[Row],
        seeds: Sequence[int | None] | None = None,
        on_episode_end: Callable[[Trajectory], None] | None = None,
        rollout_fn: RolloutFn | None = None,
        on_message: MessageHook | None = None,
        sampling: SamplingParams | None = None,
    ) -> list[Trajectory]:
        """Play one episode per (environment, row); returns trajectories in input order.

        Args:
            envs: One environment per episode (instances; plain classes are adapted).
            rows: Dataset rows: `prompt` (messages or text) and the `reset` arguments.
            seeds: Seeds for `reset`, e.g. shared within a GRPO group.
            on_episode_end: Called with each trajectory as its episode ends (progress bars).
            rollout_fn: Play each episode with this async function instead of the chat or
                inline protocol (`toolgym.agents.custom`).
            on_message: Called with (episode index, message) as each message joins an
                episode's conversation: the prompt, each assistant turn, each tool result
                (live displays such as `toolgym play`).
            sampling: Temperature and top-p for these episodes only (default: the agent's
                `sampling`); concurrent runs with different settings never see each other's
                (an evaluation while training rollouts are in flight).
        """

        async def with_tool_threads() -> list[Trajectory]:
            loop = asyncio.get_running_loop()
            loop.set_default_executor(
                ThreadPoolExecutor(self.tool_threads, thread_name_prefix="toolgym-tool")
            )
            return await self.arun(
                envs, rows, seeds, on_episode_end, rollout_fn, on_message, sampling
            )

        return run_coroutine(with_tool_threads())

    def _scheduler(self) -> PerRequest | RequestBatcher:
        per_request = capabilities(self.engine).per_request
        if self.scheduler == "continuous" or (self.scheduler == "auto" and per_request):
            if not per_request:
                raise ValueError(f"{type(self.engine).__name__} has no submit(): use 'batch'")
            return PerRequest(cast(PerRequestEngine, self.engine))
        return RequestBatcher(self.engine, self.batch_wait, self._engine_thread)

    async def arun(
        self,
        envs: Sequence[Any],
        rows: Sequence[Row],
        seeds: Sequence[int | None] | None = None,
        on_episode_end: Callable[[Trajectory], None] | None = None,
        rollout_fn: RolloutFn | None = None,
        on_message: MessageHook | None = None,
        sampling: SamplingParams | None = None,
    ) -> list[Trajectory]:
        """The async form of `run`."""
        if len(envs) != len(rows):
            raise ValueError(f"got {len(envs)} environments for {len(rows)} rows")
        seeds = list(seeds) if seeds is not None else [None] * len(rows)
        batcher = self._scheduler()

        async def play(index: int, env: Any, row: Row, seed: int | None) -> Trajectory:
            batcher.episode_started()
            try:
                episode = Episode(
                    self, as_environment(env), dict(row), seed, batcher, sampling, key=(index,)
                )
                if on_message is not None:
                    episode.on_message = functools.partial(on_message, index)
                trajectory = await episode.play(rollout_fn)
            finally:
                batcher.episode_ended()
            if on_episode_end is not None:
                on_episode_end(trajectory)
            return trajectory

        episodes = [
            play(index, *args) for index, args in enumerate(zip(envs, rows, seeds, strict=True))
        ]
        return list(await asyncio.gather(*episodes))


class Episode(RolloutContext):
    """One environment played to its end; `play()` returns its Trajectory. It is the context
    its rollout function gets (`RolloutContext`), and implements the engine and environment
    calls that context makes, under the agent's limits."""

    def __init__(
        self,
        agent: Agent,
        env: Any,
        row: Row,
        seed: int | None,
        batcher: PerRequest | RequestBatcher,
        sampling: SamplingParams | None = None,
        subagents: bool = True,
        key: tuple[object, ...] = (0,),
    ) -> None:
        self.agent, self.batcher = agent, batcher
        self.key = key
        """This episode's place in its run (its index; a sub-episode's adds its own): with a
        seeded `sampling`, each completion's seed is drawn from it and the turn."""
        self._subepisodes = 0
        self.subagents = subagents
        """Whether the agent's sub-agents are tools of this episode (not of a sub-episode)."""
        self.env: Steppable = env
        self.sampling = sampling or agent.sampling  # read once: never swapped under the episode
        self.on_message = lambda message: None
        """Told of each message as it joins the conversation (`Agent.run`'s `on_message`)."""
        self._reward = None
        """A score the rollout function gave the episode itself (`RolloutContext.reward`);
        None: the environment's `get_reward()`."""
        self.first_prompt_length = None
        """The first prompt's length (set by `RolloutContext.start`): the token budget counts
        every token after it."""
        self.session = uuid.uuid4().hex
        """This episode's key in its engine requests (one server holds its turns)."""
        self.prompt = row.pop("prompt", None)
        self._row, self.seed = row, seed
        self.limits = agent.limits
        self.time_limits = agent.limits.time_limits
        """The seconds this episode's calls into the environment may take (`within`)."""
        self.metrics = dict.fromkeys(
            (
                "turns",
                "tool_calls",
                "tool_failures",
                "parse_failures",
                "generation_seconds",
                "tool_seconds",
                "inexact_observations",
            ),
            0.0,
        )

    async def play(self, rollout_fn: RolloutFn | None = None) -> Trajectory:
        """Play the episode to its end with `rollout_fn` (default: the inline protocol for an
        environment with `inline_markers`, else the chat tool-call loop); its trajectory
        (never raises)."""
        try:
            row = self._row
            if self.prompt is not None and trl_shaped(self.env):  # TRL's reset sees the prompt
                row = {**row, "prompt": self.prompt}
            first = await asyncio.to_thread(self.env.reset, seed=self.seed, **row)
            joiner = "" if trl_shaped(self.env) else "\n\n"  # TRL appends it as it is
            self._open(_prompt_messages(self.prompt, first, joiner), self.subagents)
            rollout_fn = rollout_fn or self.agent.default_rollout(self.env)
        except Exception as error:
            prompt = [] if self.prompt is None else _prompt_messages(self.prompt, None)
            return await self._finish(Trajectory(messages=prompt), "env_error", error)
        try:
            trajectory = await rollout_fn(self, self.env)
            if not isinstance(trajectory, Trajectory):
                raise TypeError(
                    f"the rollout function returned {type(trajectory).__name__}, not a Trajectory"
                )
        except EpisodeEnd as end:
            return await self._finish(self.trajectory or Trajectory(), end.status, end.error)
        except Exception as error:
            failed = self.trajectory or Trajectory()
            what = "the rollout function failed" if self.trajectory else "the episode failed"
            return await self._finish(failed, "env_error", f"{what}: {error!r}")
        return await self._finish(trajectory, "length" if self.hit_length else "finished")

    async def _env_final_answer(self, text: str) -> None:
        """The environment's `final_answer`, off the event loop and under the tool timeout
        (a sandbox that died or hangs ends this episode, not the run)."""
        await self._env_call(asyncio.to_thread(self.env.final_answer, text), "final_answer")

    async def _env_user_turn(self, answer: str) -> str | None:
        """The environment's `user_turn`, off the event loop and under the tool timeout (the
        model's answer is its input, as a tool call's arguments are)."""
        return await self._env_call(asyncio.to_thread(self.env.user_turn, answer), "user_turn")

    async def _play_subepisode(self, env: Any, row: Row) -> Trajectory:
        """Another episode on the same engine, batcher and sampling, with no sub-agents; this
        episode waits for it, so the batcher's count of live episodes stays as it is."""
        episode = Episode(
            self.agent,
            as_environment(env),
            dict(row),
            self.seed,
            self.batcher,
            self.sampling,
            False,
            key=(*self.key, "sub", self._subepisodes),
        )
        self._subepisodes += 1
        return await episode.play()

    async def _env_inline_step(self, text: str) -> InlineStep:
        """The environment's `inline_step`, counted as a tool call, under the tool timeout."""
        step = await self._env_call(self.env.ainline_step(text), "inline_step")
        self.metrics["tool_calls"] += 1
        self.metrics["tool_failures"] += step.failed
        return step

    def tokens_left(self, trajectory: Trajectory) -> int:
        """Tokens the next turn may still add: the episode budget counts every token after the
        first prompt (model and observation, over all samples: `tokens_used`), the context
        counts the last sample's whole sequence."""
        length = len(trajectory.prompt_ids) + len(trajectory.completion_ids)
        context = self.agent.engine.context_length - length
        return min(self.limits.max_episode_tokens - self.tokens_used(trajectory), context)

    async def _complete(
        self, trajectory: Trajectory, stop_strings: list[str] | None = None
    ) -> Completion:
        """A completion continuing `trajectory` under the episode's limits (not appended)."""
        room = self.tokens_left(trajectory)
        if room <= 0:
            raise EpisodeEnd("length")
        sampling = SamplingParams(
            max_tokens=min(self.limits.max_new_tokens, room),
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            stop_token_ids=list(self.agent.renderer.profile.stop_token_ids),
            stop_strings=stop_strings or [],
            seed=None
            if self.sampling.seed is None
            else completion_seed(self.sampling.seed, *self.key, self.turns),
        )
        started = time.perf_counter()
        try:
            ids = trajectory.prompt_ids + trajectory.completion_ids
            images = trajectory.samples[-1].images
            request = GenerationRequest(ids, sampling, session=self.session, images=images)
            return await self.batcher.generate(request)
        except Exception as error:
            raise EpisodeEnd("engine_error", error) from error
        finally:
            self.metrics["generation_seconds"] += time.perf_counter() - started

    async def _call_tools(self, calls: Any) -> Any:
        """The environment's `astep` under the limits of one turn; counts calls and failures.

        A turn of more than `max_tool_calls_per_turn` calls runs none of them (the episode
        ends `too_many_calls`). Each call runs under `tool_call_timeout` and the turn's calls
        together under `tool_timeout` (enforced by the environment's `Stepper`, which answers
        a call past its limit and ends the episode; `end_if_failed` raises its status)."""
        calls = as_call_list(calls)
        limits = self.limits
        if len(calls) > limits.max_tool_calls_per_turn:
            raise EpisodeEnd(
                "too_many_calls",
                f"{len(calls)} tool calls in one turn; at most "
                f"{limits.max_tool_calls_per_turn} (AgentLimits.max_tool_calls_per_turn)",
            )
        time_limits = self.time_limits
        work = self.env.astep(calls, call_timeout=time_limits.call, turn_timeout=time_limits.turn)
        # the environment keeps the limits; this one only stops an event loop held too long
        backstop = (
            None if time_limits.turn is None else time_limits.turn + min(time_limits.turn, 5.0)
        )
        step = await self._env_call(work, "tool calls", backstop)
        if len(step.results) == len(step.messages):  # each message names its call's failure
            for message, result in zip(step.messages, step.results, strict=True):
                message.setdefault("failure", result.failure)
        self.metrics["tool_calls"] += step.info["tool_calls"]
        self.metrics["tool_failures"] += step.info["tool_failures"]
        return step

    async def _env_call(self, call: Awaitable[T], what: str, timeout: float | None = None) -> T:
        """One of the model's calls into the environment (its tool calls, its text for
        `inline_step`, `user_turn` or `final_answer`) under its time limit (by default one
        call's, `TimeLimits.one_call`), its time counted as tool time. Whose failure it is,
        the one rule `failure_status` reads from its type: past the limit the model's
        `tool_timeout` (`CallTimedOut`); a `ModelFailure` `tool_crash`; an
        `InfrastructureFailure` or anything else the environment failing, `env_error`
        (model mistakes never raise out of the environment)."""
        started = time.perf_counter()
        if timeout is None:
            timeout = self.time_limits.one_call
        try:
            return await within(call, timeout, what)
        except Exception as error:
            raise EpisodeEnd(cast(Status, failure_status(error)), error) from error
        finally:
            self.metrics["tool_seconds"] += time.perf_counter() - started

    def decode(self, completion: Completion) -> str:
        """A completion's text without its final stop token."""
        ids = completion.token_ids
        if (
            completion.finish_reason == "stop"
            and ids
            and ids[-1] in self.agent.renderer.profile.stop_token_ids
        ):
            ids = ids[:-1]
        return self.agent.tokenizer.decode(ids, skip_special_tokens=False)

    async def _read_outcome(self, trajectory: Trajectory) -> None:
        """The environment's reward (None where it gives none) and episode metrics into
        `trajectory`, each off the event loop under the tool timeout; a failure or a hang is an
        `env_error` with reward 0 that names the call. An episode that already failed (its
        sandbox may be gone) gets no metrics."""
        read_metrics = getattr(self.env, "episode_metrics", None)
        if trajectory.ended_by_failure:  # the environment may be gone: keep the failure
            read_metrics = None
        what = "get_reward"
        try:
            own = self._reward is not None  # the rollout function scored it
            value = self._reward if own else await self._read(self.env.get_reward)
            reward = None if value is None else float(value)  # None: no reward (TRL, OpenEnv)
            if reward is not None and not math.isfinite(reward):  # a NaN poisons its group
                raise ValueError(f"the reward is {reward}, not a finite number")
            what = "episode_metrics"
            if callable(read_metrics):
                trajectory.env_metrics = as_episode_metrics(await self._read(read_metrics))
            trajectory.reward = reward
            if trajectory.status in MODEL_FAILURES and self.limits.model_failure_reward is not None:
                trajectory.reward = self.limits.model_failure_reward
        except ReadTimedOut as error:  # reading the outcome is not the model's doing
            trajectory.reward, trajectory.status = 0.0, "env_error"
            trajectory.error = str(error)
        except Exception as error:
            trajectory.reward, trajectory.status = 0.0, "env_error"
            trajectory.error = f"{what} failed: {error!r}"

    async def _read(self, method: Callable[[], Any]) -> Any:
        """One of the environment's own reads (its reward, its metrics) under the turn's limit."""
        name = getattr(method, "__name__", "reading the outcome")
        return await within(
            asyncio.to_thread(method), self.time_limits.turn, name, model_caused=False
        )

    async def _finish(
        self, trajectory: Trajectory, status: Status, error: BaseException | str | None = None
    ) -> Trajectory:
        trajectory.status = status
        trajectory.error = (
            None
            if error is None
            else (error if isinstance(error, str) else f"{type(error).__name__}: {error}")
        )
        await self._read_outcome(trajectory)
        trajectory.reward_sources = {"env": trajectory.reward}
        side = getattr(self, "_side", [])  # sub-episodes, whose samples join this one's
        observed = trajectory.observation_tokens + sum(sub.observation_tokens for _, sub, _ in side)
        if len(trajectory.samples) > 1 and not trajectory.completion_ids:
            trajectory.samples.pop()  # a turn's prompt that got no tokens (a limit ended it)
        join_side_samples(trajectory, side)
        self.metrics["model_tokens"] = float(trajectory.model_tokens)
        self.metrics["observation_tokens"] = float(observed)
        trajectory.metrics = self.metrics
        trajectory.row = {k: v for k, v in self._row.items() if _is_plain(v)}
        return trajectory


def _prompt_messages(
    prompt: Any, first_observation: str | None, joiner: str = "\n\n"
) -> list[dict[str, Any]]:
    """The row's prompt as messages, with reset()'s observation appended to the last user turn
    after `joiner` (a blank line; nothing for a class written for TRL, as TRL appends it)."""
    if prompt is None:
        messages: list[dict[str, Any]] = []
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [dict(m) for m in prompt]
    if first_observation:
        first_observation = valid_text(first_observation)
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"] = f"{messages[-1]['content']}{joiner}{first_observation}"
        else:
            messages.append({"role": "user", "content": first_observation})
    if not messages:
        raise ValueError("the row has no 'prompt' and reset() returned no observation")
    return messages


def _is_plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), list, dict))
