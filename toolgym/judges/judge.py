"""`Judge`: a reward that a model gives. It is a reward function (async, called as TRL calls
reward functions, once per batch of finished episodes), so a trainer takes it in
`reward_funcs` beside any other source:

    judge = Judge(EngineClient(engine, tokenizer), Rubric((Criterion("correct", "..."),)))
    GRPOTrainer(model, env, rows, reward_funcs=[judge], ...)

Each episode is shown to the judge as its task and a transcript of what followed (`transcript`):
one at a time (`mode="pointwise"`: a score per criterion, their weighted mean) or a group's
episodes in one chat (`mode="group"`: each scored against the others, as RULER does; a group
is the consecutive episodes of one task, as a trainer's batch holds them). Answers are scores
in [0, 1].

Bounds: at most `max_concurrency` judge calls at once, each under `timeout` seconds; identical
chats are asked once (`cache`). Judging happens after the episodes end, on its own event loop:
it never holds up the rollouts' scheduler.

A judge that cannot score an episode (it timed out, its model failed, its answer held no
scores) is not the policy's doing: the episode's value is None and its status `judge_error`,
an infrastructure failure left out of the baselines and the loss (named in its `error`), and
`judge/<name>/failures` counts it. Every call is kept with its episodes in
`Trajectory.judgements` (the chat, the answer, the scores, seconds, whether cached) and shown
by `toolgym view`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from toolgym.agents.chat_clients import ChatClient, ChatClientError, Messages
from toolgym.agents.trajectory import INFRASTRUCTURE_FAILURES, Trajectory
from toolgym.envs.time_limits import ReadTimedOut, within
from toolgym.judges.rubric import JudgeFailure, JudgeUnreachable, Rubric

Transcript = Callable[[Trajectory], tuple[str, str]]
"""An episode as the judge reads it: (the task, what followed)."""


def transcript(trajectory: Trajectory, limit: int = 6000) -> tuple[str, str]:
    """The task (the prompt's user and system text) and the episode after it: each assistant
    turn's text and tool calls, each tool's result, each later user turn; the episode's end is
    kept when it is longer than `limit` characters."""
    messages = trajectory.messages
    start = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), 0)
    task = "\n\n".join(_text(m) for m in messages[:start] if m.get("role") in ("user", "system"))
    lines = []
    for message in messages[start:]:
        role = message.get("role", "?")
        text = _text(message)
        if role == "tool":
            lines.append(f"[tool result{_named(message)}] {text}")
        elif role == "assistant":
            lines.append(f"[assistant] {text}" if text else "[assistant]")
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                arguments = function.get("arguments")
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                lines.append(f"[tool call] {function.get('name')}({arguments})")
        else:
            lines.append(f"[{role}] {text}")
    episode = "\n".join(lines)
    if len(episode) > limit:
        episode = "[... the episode's start is left out ...]\n" + episode[-limit:]
    return task, episode


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content blocks: their text
        content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content or "").strip()


def _named(message: dict[str, Any]) -> str:
    return f" of {message['name']}" if message.get("name") else ""


class Judge:
    """A reward function whose values a judge model gives (see the module docstring).

    Args:
        client: The judge's model (`EngineClient`, `OpenAIClient`, or any `ChatClient`).
        rubric: What it scores and how its answer is read.
        mode: "pointwise" (each episode alone) or "group" (a group's episodes in one chat).
        name: The reward source's name (`reward_sources`, metrics, the episode's record).
        max_concurrency: Judge calls in flight at once.
        timeout: Seconds one judge call may take.
        cache: Ask an identical chat only once (in memory, the latest `cache_size` answers).
        cache_size: How many answers the cache keeps.
        transcript: What the judge reads of an episode (default `transcript`).
    """

    def __init__(
        self,
        client: ChatClient,
        rubric: Rubric | None = None,
        *,
        mode: Literal["pointwise", "group"] = "pointwise",
        name: str = "judge",
        max_concurrency: int = 4,
        timeout: float = 120.0,
        cache: bool = True,
        cache_size: int = 4096,
        transcript: Transcript = transcript,
    ) -> None:
        if mode not in ("pointwise", "group"):
            raise ValueError(f"mode must be 'pointwise' or 'group', not {mode!r}")
        if max_concurrency < 1 or not timeout > 0:
            raise ValueError("max_concurrency must be >= 1 and timeout > 0")
        self.client, self.rubric = client, rubric or Rubric()
        self.mode, self.__name__ = mode, name
        self.max_concurrency, self.timeout = max_concurrency, timeout
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self.cache_size = cache_size if cache else 0
        self._answers: OrderedDict[str, str] = OrderedDict()
        self.read = transcript
        self._secret = secrets.token_bytes(16)
        self.calls = 0
        """Judge calls made (cache hits not counted)."""

    async def __call__(
        self, trajectories: Sequence[Trajectory], log_metric: Any = None, **_: Any
    ) -> list[float | None]:
        asked: dict[str, asyncio.Task[str]] = {}  # this batch's chats, each asked once
        read = [self.read(t) for t in trajectories]
        groups = _groups(read) if self.mode == "group" else [[i] for i in range(len(read))]
        values: list[float | None] = [None] * len(trajectories)
        seconds: list[float] = []
        failures = 0

        async def judge(members: list[int]) -> None:
            nonlocal failures
            task = read[members[0]][0]
            episodes = [read[i][1] for i in members]
            fence = self._fence(task, episodes)
            if self.mode == "group" and len(members) > 1:
                messages = self.rubric.group_messages(task, episodes, fence)
            else:
                messages = self.rubric.pointwise_messages(task, episodes[0], fence)
            started = time.perf_counter()
            answer, cached, scores, error = "", False, None, None
            try:
                answer, cached = await self._answer(messages, asked)
                scores = self._scores(answer, len(members))
            except JudgeFailure as failure:
                error = f"judge {self.__name__}: {failure}"
            took = time.perf_counter() - started
            seconds.append(took)
            for position, index in enumerate(members):
                record: dict[str, Any] = {
                    "judge": self.__name__,
                    "model": self.client.name,
                    "mode": self.mode,
                    "messages": messages,
                    "answer": answer,
                    "seconds": round(took, 4),
                    "cached": cached,
                }
                if len(members) > 1:
                    record["position"] = position + 1
                if scores is None:
                    failures += 1
                    record["error"] = error
                    _mark_failed(trajectories[index], error or "")
                else:
                    value, parts = scores[position]
                    values[index] = value
                    record["score"] = value
                    if parts is not None:
                        record["scores"] = parts
                trajectories[index].judgements.append(record)

        await asyncio.gather(*(judge(members) for members in groups))
        if log_metric is not None and seconds:
            log_metric(f"judge/{self.__name__}/seconds", sum(seconds) / len(seconds))
            log_metric(f"judge/{self.__name__}/failures", float(failures))
        return values

    def _fence(self, task: str, episodes: list[str]) -> str:
        """The tag that fences the judged text: keyed by this judge's secret and the text, so
        the same chat is asked the same way (the cache holds) while no episode can write the
        tag that closes its fence."""
        content = json.dumps([task, episodes], ensure_ascii=False).encode()
        return "work-" + hmac.new(self._secret, content, hashlib.sha256).hexdigest()[:16]

    def _scores(self, answer: str, count: int) -> list[tuple[float, dict[str, float] | None]]:
        """(the value in [0, 1], each criterion's score or None) per judged episode."""
        if self.mode == "group" and count > 1:
            return [(value, None) for value in self.rubric.parse_group(answer, count)]
        parts = self.rubric.parse_pointwise(answer)
        return [(self.rubric.total(parts), parts)]

    async def _answer(
        self, messages: Messages, asked: dict[str, asyncio.Task[str]]
    ) -> tuple[str, bool]:
        """The judge's answer to `messages` and whether another call's answer served it: the
        cache, or the same chat asked in this batch (`asked`, in flight or done)."""
        key = json.dumps([self.client.name, messages], ensure_ascii=False)
        if key in self._answers:
            self._answers.move_to_end(key)
            return self._answers[key], True
        if key in asked:
            return await asyncio.shield(asked[key]), True
        asked[key] = asyncio.ensure_future(self._ask(messages))
        answer = await asyncio.shield(asked[key])
        if self.cache_size:
            self._answers[key] = answer
            while len(self._answers) > self.cache_size:
                self._answers.popitem(last=False)
        return answer, False

    async def _ask(self, messages: Messages) -> str:
        """One call to the judge's model, in one of the judge's `max_concurrency` slots (shared
        by every batch it judges at once: pipelined steps run on loops of their own), under
        the timeout."""
        while not self._slots.acquire(blocking=False):  # polled: a waiting call holds no
            await asyncio.sleep(0.01)  # thread (the clients run on the loop's thread pool)
        try:
            self.calls += 1
            return await within(
                self.client.complete(messages), self.timeout, "the judge", model_caused=False
            )
        except ReadTimedOut as error:
            raise JudgeFailure(str(error)) from error
        except JudgeFailure:
            raise
        except ChatClientError as error:
            raise JudgeUnreachable(f"the judge's model failed: {error}") from error
        except Exception as error:  # a client's own bug is the judge's failure too
            raise JudgeUnreachable(f"the judge's client failed: {error!r}") from error
        finally:
            self._slots.release()


def _groups(read: list[tuple[str, str]]) -> list[list[int]]:
    """Runs of consecutive episodes of one task (a trainer's batch holds a group's members
    together; with several processes a group split between them is judged in parts)."""
    groups: list[list[int]] = []
    for index, (task, _) in enumerate(read):
        if groups and read[groups[-1][0]][0] == task:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _mark_failed(trajectory: Trajectory, error: str) -> None:
    """A judge failure ends the episode `judge_error` (an infrastructure failure already
    recorded is kept: it came first)."""
    if trajectory.status not in INFRASTRUCTURE_FAILURES:
        trajectory.status, trajectory.error = "judge_error", error
