"""Sub-agents: a tool the model calls to hand a task to another episode of the same policy.

`Agent(subagents=[SubAgent("delegate")])` adds a tool to every episode's tool list: its one
argument is the task. When the model calls it, a sub-episode plays the task from a fresh
conversation (the task as its user turn) on `SubAgent.make_env()` (default: `Helper`, an
environment without tools, so the helper only thinks and answers) with the same engine and
limits, and its final answer comes back as the tool's result. The sub-episode's samples join
the caller's trajectory when the episode ends, each with the sub-agent's `role` and the
caller's sample that made the call as the root's `parent`; they train with the episode's
advantage (the caller's reward credits the helper's work). Sub-episodes call no sub-agents
themselves (one level), and have their own token budget.

    sample 0: the helper's answer   (role "subagent", parent 1)
    sample 1: the caller's episode  (role "policy", parent None; still the last sample)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.envs.calls import StepResult, ToolCall
from toolgym.envs.core import Environment
from toolgym.envs.tools import valid_text


class Helper(Environment):
    """A sub-episode's default environment: no tools; the helper's answer is the result."""

    def reset(self) -> None:
        """Nothing to set up: the task is the conversation's user turn."""


@dataclass(frozen=True)
class SubAgent:
    """A tool that runs another episode (`toolgym.agents.subagents`).

    Args:
        name: The tool's name.
        description: What the model reads about it.
        role: The role of the sub-episode's samples.
        make_env: A fresh environment for each call (its tools are the helper's); None: a
            `Helper` (no tools).
        system: The helper's system turn (None: none).
    """

    name: str = "delegate"
    description: str = (
        "Hand a sub-task to a helper, who works on it alone (it sees only the task) and "
        "answers with its result."
    )
    role: str = "subagent"
    make_env: Callable[[], Any] | None = None
    system: str | None = None

    def schema(self) -> dict[str, Any]:
        """The tool's schema, as the model sees it."""
        task = {"type": "string", "description": "The sub-task, stated in full."}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {"task": task},
                    "required": ["task"],
                },
            },
        }

    def environment(self) -> Any:
        """A fresh environment for one call."""
        return self.make_env() if self.make_env is not None else Helper()

    def prompt(self, task: str) -> list[dict[str, Any]]:
        """The sub-episode's first messages (the task's undecodable characters escaped: the
        model wrote it, and no tokenizer takes lone surrogates)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": valid_text(task)}]


def result_text(sub: Trajectory) -> str:
    """What a sub-episode hands back: its last answer; for one that did not finish, what
    stopped it too."""
    answers = [m for m in sub.messages if m["role"] == "assistant"]
    answer = str(answers[-1].get("content") or "") if answers else ""
    if sub.status in ("finished", "env_done"):
        return answer
    why = f"{sub.status}: {sub.error}" if sub.error else sub.status
    return f"The helper stopped ({why}). Its last words: {answer}"


def join_side_samples(trajectory: Trajectory, side: list[tuple[int, Trajectory, str]]) -> None:
    """Put the samples of sub-episodes (`(spawning sample, sub-episode, role)`) into
    `trajectory.samples`, before its last sample (which stays the episode as the model last
    saw it): each sub-episode's samples keep their own links, its root's parent is the sample
    that made the call, and step rewards that name the last sample follow it."""
    if not side:
        return
    main = trajectory.samples
    last = len(main) - 1
    total = sum(len(sub.samples) for _, sub, _ in side)

    def moved(index: int) -> int:  # a main sample's index in the joined list
        return index + total if index == last else index

    joined: list[Sample] = []
    for spawner, sub, role in side:
        start = last + len(joined)
        for sample in sub.samples:
            parent = moved(spawner) if sample.parent is None else start + sample.parent
            sample.parent, sample.role = parent, role
            joined.append(sample)
    trajectory.samples = [*main[:last], *joined, main[last]]
    for step in trajectory.step_rewards:
        if step.get("sample") == last:
            step["sample"] = last + total
    if len(trajectory.shared) > last:  # a tree member: the last sample's shared count follows it
        trajectory.shared[last:] = [0] * total + trajectory.shared[last:]


async def step_with_subagents(ctx: Any, calls: list[Any], target: Trajectory | None) -> StepResult:
    """One turn's calls where some name one of `ctx`'s sub-agents (`ctx` is the episode's
    `RolloutContext`): the environment's calls run first (one step, under its limits), then
    each sub-agent call plays its sub-episode; the results come back in call order, each
    sub-agent's with its sub-episode's conversation (`subepisode`)."""
    delegated = [isinstance(c, ToolCall) and c.name in ctx._subagents for c in calls]
    own = [c for c, d in zip(calls, delegated, strict=True) if not d]
    step = await ctx._call_tools(own) if own else None
    env_messages = iter(step.messages if step is not None else [])
    messages, failures = [], 0
    for call, is_subagent in zip(calls, delegated, strict=True):
        if not is_subagent:
            messages.append(next(env_messages))
            continue
        message = await delegate(ctx, call, target)
        failures += message.get("failure") is not None
        messages.append(message)
    info = dict(step.info) if step is not None else {"failures": []}
    info["tool_calls"] = info.get("tool_calls", 0) + sum(delegated)
    info["tool_failures"] = info.get("tool_failures", 0) + failures
    ctx.metrics["tool_calls"] += sum(delegated)
    ctx.metrics["tool_failures"] += failures
    if step is None:
        return StepResult(messages, 0.0, False, False, info)
    return StepResult(messages, step.reward, step.terminated, step.truncated, info)


async def delegate(ctx: Any, call: ToolCall, target: Trajectory | None) -> dict[str, Any]:
    """A sub-agent call: its sub-episode played to its end (`ctx._play_subepisode`), kept to
    join the trajectory (`ctx._side`), and its answer as the call's tool message (a call
    without a task is refused)."""
    subagent = ctx._subagents[call.name]
    message: dict[str, Any] = {"role": "tool", "name": call.name}
    if call.id is not None:
        message["tool_call_id"] = call.id
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    task = arguments.get("task")
    if not isinstance(task, str) or not task.strip() or set(arguments) != {"task"}:
        message["content"] = f"Error: {call.name} takes one argument, task (text)."
        message["failure"] = "invalid_arguments"
        return message
    env = subagent.environment()
    try:
        sub = await ctx._play_subepisode(env, {"prompt": subagent.prompt(task)})
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    spawner = len(target.samples) - 1 if target is not None else 0
    if not sub.failed:  # an infrastructure failure's tokens stay out of the loss
        ctx._side.append((spawner, sub, subagent.role))
    message["content"] = result_text(sub)
    message["subepisode"] = {"role": subagent.role, "status": sub.status, "messages": sub.messages}
    if sub.status not in ("finished", "env_done"):
        message["failure"] = "tool_error"
    return message
