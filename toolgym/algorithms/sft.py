"""Optional supervised warm-up on environment demonstrations.

Small models often cannot call tools at all at first (SmolLM2-135M made no valid tool call in
8 Wordle episodes), so GRPO has nothing to compare. An environment that implements
`demonstration()` (Wordle's expert does) supplies expert tool calls (or, for inline
environments, the pieces of text the expert writes, e.g. `PythonLines-v0`'s lines); they are
played through
the real agent loop with a scripted engine, so a demonstration is a `Trajectory` with exactly
the tokens, masks and tool results a model would see, and the warm-up trains on the
assistant tokens only (loss mask 1), like the policy-gradient loss.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from toolgym.agents.chat import TemplateProfile
from toolgym.agents.engines.scripted import ScriptedEngine
from toolgym.agents.rollout import Agent, AgentLimits
from toolgym.agents.trajectory import Trajectory
from toolgym.algorithms.batch import collate, training_samples
from toolgym.algorithms.config import SFTConfig
from toolgym.algorithms.environments import EpisodeFactory
from toolgym.algorithms.losses import compile_by_default, token_logprobs
from toolgym.algorithms.optim import adamw
from toolgym.algorithms.prefix_sharing import share_prefix_by_default
from toolgym.algorithms.turn_credit import turns
from toolgym.envs.calls import close_all
from toolgym.envs.stepping import as_environment


def demonstrations(
    make_env: EpisodeFactory,
    rows: Sequence[dict[str, Any]],
    tokenizer: Any,
    *,
    seeds: Sequence[int | None] | None = None,
    parser: str = "auto",
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    per_turn: bool | None = None,
    template_profile: TemplateProfile | None = None,
) -> list[Trajectory]:
    """Play each row with the environment's expert; returns the demonstration trajectories
    (built as the RL episodes will be: the same template, template variables and per-turn
    choice). `make_env` makes each row's environment: `episode_factory("Wordle-v0")` (an id,
    a class, a factory of no arguments, tool functions, several by name), or a trainer's
    `make_env`. `template_profile` (an agent's `renderer.profile`) renders with what that
    agent learned of the template, its training template included, without learning it again.

    Raises:
        ValueError: The environment offers no demonstrations.
    """
    seeds = list(seeds) if seeds is not None else [None] * len(rows)
    agent = Agent(
        ScriptedEngine([]),
        tokenizer,
        parser=parser,
        chat_template=chat_template,
        chat_template_kwargs=dict(chat_template_kwargs or {}),
        per_turn=per_turn,
        template_profile=template_profile,
    )
    trajectories: list[Trajectory] = []
    for row, seed in zip(rows, seeds, strict=True):
        expert = as_environment(make_env(row, seed))
        try:
            expert.reset(seed=seed, **{k: v for k, v in row.items() if k != "prompt"})
            turns = expert.demonstration()
            if turns is None:
                name = expert.executor.target.__name__
                raise ValueError(f"{name} offers no demonstrations (demonstration())")
            if getattr(expert, "inline_markers", ()):  # the pieces of text the expert writes
                replies = [tokenizer.encode(piece, add_special_tokens=False) for piece in turns]
            else:
                replies = [
                    agent.renderer.assistant_ids(_assistant_message(calls), expert.tools)
                    for calls in turns
                ]
        finally:
            expert.close()
        agent.engine = ScriptedEngine(replies, tokenizer=tokenizer)
        agent.limits = AgentLimits(
            max_turns=len(replies), max_new_tokens=max(map(len, replies)), max_episode_tokens=10**9
        )
        played = make_env(row, seed)
        try:
            trajectories.extend(map(_refused_turns_unlearned, agent.run([played], [row], [seed])))
        finally:
            close_all([played])
    return trajectories


def _refused_turns_unlearned(trajectory: Trajectory) -> Trajectory:
    """The demonstration with the loss mask cleared on each assistant turn whose call the
    environment refused (a tool message with a `failure`): an expert may show a mistake and
    what follows it (Wordle's `demo_refusals`), and the warm-up learns what follows, never the
    mistake. Turns are matched to runs of sampled tokens in order (`turn_credit.turns`)."""
    refused: set[int] = set()
    turn = -1
    for message in trajectory.messages:
        if message.get("role") == "assistant":
            turn += 1
        elif message.get("role") == "tool" and message.get("failure") and turn >= 0:
            refused.add(turn)
    if not refused:
        return trajectory
    spans = turns(trajectory)
    if len(spans) <= max(refused):
        raise ValueError(
            f"a demonstration has {len(spans)} runs of sampled tokens for "
            f"{turn + 1} assistant turns: cannot tell which tokens made the refused calls"
        )
    for index in refused:
        span = spans[index]
        mask = trajectory.samples[span.sample].loss_mask
        mask[span.start : span.end] = [0] * (span.end - span.start)
    return trajectory


def _assistant_message(calls: Sequence[Any]) -> dict[str, Any]:
    tool_calls = [
        {"type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
        for c in calls
    ]
    return {"role": "assistant", "content": "", "tool_calls": tool_calls}


def _arguments(arguments: dict | str) -> dict:
    return json.loads(arguments) if isinstance(arguments, str) else dict(arguments)


def warmup_sft(
    model: Any,
    trajectories: Sequence[Trajectory],
    pad_id: int,
    config: SFTConfig | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Fine-tune `model` in place on the sampled (assistant) tokens of `trajectories`: each
    optimizer step takes `batch_size` trajectories, in passes of `micro_batch_size` whose
    gradients add up to the step's mean token loss.

    Returns the loss of every optimizer step.
    """
    config = config or SFTConfig()
    if config.batch_size < 1 or config.micro_batch_size > config.batch_size:
        raise ValueError(
            f"SFTConfig: batch_size {config.batch_size} (trajectories per optimizer step) must "
            f"be at least 1 and at least micro_batch_size {config.micro_batch_size} (per "
            "forward/backward pass; it used to mean per step)"
        )
    order = list(range(len(trajectories)))
    steps = config.epochs * -(-len(order) // config.batch_size)
    optimizer = adamw(model.parameters(), lr=config.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / max(steps, 1))
    rng, losses = random.Random(config.seed), []
    was_training = model.training
    model.train()
    for _ in range(config.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            chosen = [trajectories[i] for i in order[start : start + config.batch_size]]
            losses.append(_sft_step(model, chosen, pad_id, config))
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if on_step is not None:
                on_step(len(losses), losses[-1])
    model.train(was_training)
    return losses


def _sft_step(model: Any, chosen: list[Trajectory], pad_id: int, config: SFTConfig) -> float:
    """Forward and backward passes over one step's trajectories (gradients accumulate);
    returns the step's loss. Similar lengths share a pass, so little is padding."""
    device = next(model.parameters()).device
    chosen = sorted(chosen, key=lambda t: len(t.prompt_ids) + len(t.completion_ids))
    size = config.micro_batch_size or len(chosen)
    batches = [
        collate(training_samples(chosen[i : i + size]), pad_id) for i in range(0, len(chosen), size)
    ]
    tokens = sum(float(batch.loss_mask[:, 1:].sum()) for batch in batches)
    total = 0.0
    for batch in batches:
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16):
            logprobs = token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                config.logprob_chunk_size,
                compiled=compile_by_default(config.compile_logprobs, device),
                share_prefix=share_prefix_by_default(config.share_prefix, device),
            )
        loss = -(logprobs * batch.loss_mask[:, 1:]).sum() / max(tokens, 1.0)
        loss.backward()
        total += loss.item()
    return total
