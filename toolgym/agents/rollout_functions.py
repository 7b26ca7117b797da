"""The built-in rollout functions: the chat tool-call loop and the inline protocol.

Both are written against the public `RolloutContext`, exactly as a user's `rollout_fn` is:
the context owns limits, metrics and token bookkeeping, so "generate, count, append" and the
end-of-turn rule live there once. `Agent.run` plays an environment with `inline_rollout`
when it declares `inline_markers`, else with `chat_rollout`, unless a `rollout_fn` is given.
"""

from __future__ import annotations

import asyncio
from typing import Any

from toolgym.agents.custom import EpisodeEnd, RolloutContext, assistant_message
from toolgym.agents.images import tool_images, unseen_images
from toolgym.agents.trajectory import Trajectory
from toolgym.envs.tools import UnrenderableResult


async def chat_rollout(ctx: RolloutContext, env: Any) -> Trajectory:
    """The chat tool-call loop: the model writes a turn, its tool calls run, their results
    are appended as the template renders them (mask 0), until the model answers without a
    call and the user has nothing more to say (`Environment.user_turn`; the answer then goes
    to `final_answer`), the environment ends the episode, or a limit.

    Prefix-preserving templates make one sequence; others one sample per turn, each turn's
    prompt the template's rendering of the conversation so far (`TemplateProfile.per_turn`)."""
    trajectory = ctx.start(tools=ctx.tools)
    if not await chat_turns(ctx, trajectory, 0, ctx.limits.max_turns):
        raise EpisodeEnd("max_turns")
    return trajectory


async def chat_turns(ctx: RolloutContext, trajectory: Trajectory, first: int, stop: int) -> bool:
    """The chat loop's turns `first` to `stop - 1` on `trajectory` (turn `first` is the next
    to generate); True once the episode ended (the model answered and the user is done),
    False when turn `stop` is reached with the episode still open (a tree rollout branches
    there: `toolgym.algorithms.tree_rollouts`). Other endings raise `EpisodeEnd`."""
    renderer, tools = ctx.renderer, ctx.tools
    for turn in range(first, stop):
        if renderer.profile.per_turn and turn > 0:
            ctx.next_turn(trajectory, tools)
        if turn > 0:
            await ctx.compact(trajectory)  # past the agent's `Compaction` budget: a new sample
        generation = await ctx.generate(trajectory)
        parsed = await ctx.parse(generation.text)
        ctx.add_message(trajectory, assistant_message(generation.text, parsed))
        if generation.finish_reason == "length":
            raise EpisodeEnd("length")
        if not parsed.tool_calls:
            if await ctx.user_turn(trajectory, parsed.content, generation.last_token):
                continue  # the user spoke again: the model's next turn
            await ctx.final_answer(parsed.content)
            return True
        step = await ctx.step(parsed.tool_calls, trajectory)
        if step.terminated:
            raise EpisodeEnd("finished" if step.info.get("answered") else "env_done")
        if step.truncated:
            raise EpisodeEnd("max_turns")
        images = tool_images(step.messages)
        if images and ctx.vision is None:
            raise EpisodeEnd("env_error", UnrenderableResult(unseen_images()))
        if renderer.profile.per_turn:
            continue  # the next turn's prompt is the template's rendering of it all (images too)
        stopped_on_call_end = generation.last_token == renderer.profile.call_end_id
        if generation.last_token != renderer.profile.end_of_turn_id and not stopped_on_call_end:
            ctx.observe_ids(trajectory, [renderer.profile.end_of_turn_id])  # it stopped on EOS
        try:
            suffix = renderer.tool_suffix_ids(step.messages, tools, stopped_on_call_end)
            if ctx.vision is not None:  # one placeholder per image (none in tool text)
                suffix = await asyncio.to_thread(ctx.vision.expand, suffix, images)
        except Exception as error:
            raise EpisodeEnd("env_error", f"the chat template cannot render: {error}") from error
        ctx.observe_ids(trajectory, suffix)
        trajectory.samples[-1].images.extend(images)
    return False


async def inline_rollout(ctx: RolloutContext, env: Any) -> Trajectory:
    """The inline protocol: one assistant turn, generation stopping after each of the
    environment's `inline_markers`, its observation appended inline (mask 0), until the model
    ends its turn (its last piece goes to `final_answer`), the environment is done, or a
    limit. Each generation counts as a turn against `max_turns`; the conversation gets the
    whole turn as one assistant message."""
    ctx.tools = []  # inline episodes call no tools
    trajectory = ctx.start()
    start = len(trajectory.completion_ids)
    try:
        if not await inline_turns(ctx, trajectory, inline_markers(env), ctx.limits.max_turns):
            raise EpisodeEnd("max_turns")
        return trajectory
    finally:
        add_inline_message(ctx, trajectory, start)


def inline_markers(env: Any) -> list[str]:
    """The environment's inline markers (none: it plays the chat protocol)."""
    return list(getattr(env, "inline_markers", ()) or ())


async def inline_turns(
    ctx: RolloutContext, trajectory: Trajectory, markers: list[str], stop: int
) -> bool:
    """The inline protocol's generations until the episode has `stop` of them (`ctx.turns`);
    True once the model ended its turn (its last piece went to `final_answer`), False when
    the `stop`th generation is done with the turn still open (a tree rollout branches there:
    `toolgym.algorithms.tree_rollouts`). Other endings raise `EpisodeEnd`."""
    env = ctx.env
    while ctx.turns < stop:
        generation = await ctx.generate(trajectory, stop_strings=markers)
        if generation.finish_reason == "length":
            raise EpisodeEnd("length")
        if generation.ended_turn:
            await ctx.final_answer(generation.text)
            return True
        step = await ctx.inline_step(trajectory, generation.text)
        if step.observation:
            try:
                ctx.observe(trajectory, step.observation)
            except EpisodeEnd:
                if not step.done:
                    raise
                # a last observation that does not fit is dropped
        if step.done:
            raise EpisodeEnd("env_done")
        if getattr(env, "truncated", False):
            raise EpisodeEnd("max_turns")
    return False


def add_inline_message(ctx: RolloutContext, trajectory: Trajectory, start: int) -> None:
    """The inline turn as one assistant message: every token after `start` (the model's and
    the observations), as the model saw it."""
    text = ctx.tokenizer.decode(trajectory.completion_ids[start:], skip_special_tokens=False)
    ctx.add_message(trajectory, {"role": "assistant", "content": text, "raw_content": text})
