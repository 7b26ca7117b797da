"""User rollout functions: episodes written as an async function over the agent's helpers,
with exact tokens and masks, the agent's batching, limits and failure statuses."""

from __future__ import annotations

import math

import pytest
from helpers import inline_agent

import toolgym
from toolgym.agents import AgentLimits, EpisodeEnd, RolloutContext, Trajectory
from toolgym.testing import tiny_model, tiny_tokenizer


class Judge(toolgym.Environment):
    """Rewards an answer that contains the planned number."""

    def reset(self, target: int = 7) -> str:
        self.target = target
        return f"Say the number {target}."

    def wait(self, seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        import time

        time.sleep(seconds)
        return "waited"

    def final_answer(self, text: str) -> None:
        self.reward = float(str(self.target) in text)


async def plan_then_answer(ctx: RolloutContext, env) -> Trajectory:
    trajectory = ctx.start()
    plan = await ctx.generate(trajectory, stop_strings=["</plan>"])
    assert not plan.ended_turn and plan.text.endswith("</plan>")
    ctx.observe(trajectory, "\nChecked. Now answer.\n")
    answer = await ctx.generate(trajectory)
    assert answer.ended_turn
    env.final_answer(answer.text)
    return trajectory


def test_a_rollout_function_keeps_exact_tokens_masks_and_the_reward():
    tokenizer = tiny_tokenizer()
    agent = inline_agent(
        tokenizer, ["<plan>say 7</plan> ignored tail", "The number is 7.<|im_end|>"]
    )
    (trajectory,) = agent.run([Judge()], [{"prompt": "Go."}], rollout_fn=plan_then_answer)
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    text = tokenizer.decode(trajectory.completion_ids, skip_special_tokens=False)
    assert text == "<plan>say 7</plan>\nChecked. Now answer.\nThe number is 7.<|im_end|>"
    unsampled = [
        t for t, m in zip(trajectory.completion_ids, trajectory.loss_mask, strict=True) if not m
    ]
    assert tokenizer.decode(unsampled) == "\nChecked. Now answer.\n"
    assert "Say the number 7." in tokenizer.decode(trajectory.prompt_ids)
    assert trajectory.metrics["turns"] == 2 and trajectory.metrics["inexact_observations"] == 0


def test_limits_and_failures_of_a_rollout_function_end_only_its_episode():
    async def forever(ctx, env):
        trajectory = ctx.start()
        while True:
            await ctx.generate(trajectory)

    async def crashes(ctx, env):
        ctx.start()
        raise ValueError("my planner broke")

    async def gives_up(ctx, env):
        ctx.start()
        raise EpisodeEnd("env_done")

    async def hangs(ctx, env):
        ctx.start()
        await ctx.step(toolgym.ToolCall("wait", {"seconds": 5}))

    async def by_case(ctx, env):
        return await {"a": forever, "b": crashes, "c": gives_up, "d": hangs}[env.unwrapped.case](
            ctx, env
        )

    class Case(Judge):
        def reset(self, case: str = "a") -> str:
            self.case = case
            return super().reset()

    tokenizer = tiny_tokenizer()
    agent = inline_agent(tokenizer, ["more words"], max_turns=3, tool_timeout=0.2)
    rows = [{"prompt": "Go.", "case": case} for case in "abcd"]
    looped, crashed, ended, hung = agent.run([Case() for _ in rows], rows, rollout_fn=by_case)
    assert looped.status == "max_turns" and looped.metrics["turns"] == 3
    assert crashed.status == "env_error" and "my planner broke" in crashed.error
    assert ended.status == "env_done"
    assert hung.status == "tool_timeout"
    budget = inline_agent(tokenizer, ["more words"], max_turns=50, max_episode_tokens=20)
    (short,) = budget.run([Judge()], [{"prompt": "Go."}], rollout_fn=forever)
    assert short.status == "length"


def test_requests_of_rollout_functions_share_the_agent_s_batches():
    from toolgym.agents import Agent, ScriptedEngine

    tokenizer = tiny_tokenizer()

    def reply(prompt_ids: list[int]) -> list[int]:  # a plan first, then the answer
        planned = "</plan>" in tokenizer.decode(prompt_ids)
        return tokenizer.encode("7<|im_end|>" if planned else "<plan>7</plan>")

    engine = ScriptedEngine(reply, tokenizer=tokenizer)
    agent = Agent(engine, tokenizer, batch_wait=5.0)  # every live episode joins the batch
    rows = [{"prompt": "Go."}] * 4
    trajectories = agent.run([Judge() for _ in rows], rows, rollout_fn=plan_then_answer)
    assert all(t.status == "finished" for t in trajectories)
    assert agent.engine.batches == [4, 4]


@pytest.mark.slow
def test_the_trainer_trains_on_what_a_rollout_function_played(tmp_path):
    from toolgym.agents.trajectory import load_jsonl
    from toolgym.algorithms import GRPOConfig, GRPOTrainer

    async def two_tries(ctx, env):
        trajectory = ctx.start()
        first = await ctx.generate(trajectory)
        ctx.observe(trajectory, "\nTry again.\n")
        second = await ctx.generate(trajectory)
        env.final_answer(first.text + second.text)
        return trajectory

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        prompts_per_step=1,
        num_generations=3,
        micro_batch_size=3,
        limits=AgentLimits(max_turns=2, max_new_tokens=16, max_episode_tokens=200),
        progress_bar=False,
        save_steps=0,
    )
    rows = [{"prompt": "Go.", "target": 7}]
    trainer = GRPOTrainer(
        tiny_model(tokenizer), Judge, rows, args=args, tokenizer=tokenizer, rollout_fn=two_tries
    )
    (metrics,) = trainer.train()
    assert math.isfinite(metrics["loss"])
    (sample, *_) = load_jsonl(tmp_path / "samples.jsonl")
    assert "\nTry again.\n" in tokenizer.decode(
        [t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if not m]
    )
    assert trainer.evaluate(rows)["episodes"] == 1


def test_on_message_reaches_a_rollout_function_and_tool_messages_name_their_failure():
    """A user's rollout function tells `on_message` of the prompt (at its first `start`) and
    of what it adds; the chat loop's tool messages carry `failure` (None when a call worked)."""
    from helpers import scripted_agent

    tokenizer = tiny_tokenizer()

    async def answer_once(ctx: RolloutContext, env) -> Trajectory:
        trajectory = ctx.start()
        answer = await ctx.generate(trajectory)
        ctx.add_message(trajectory, {"role": "assistant", "content": answer.text})
        return trajectory

    seen = []
    agent = inline_agent(tokenizer, ["The number is 7.<|im_end|>"])
    agent.run(
        [Judge()],
        [{"prompt": "Go."}],
        rollout_fn=answer_once,
        on_message=lambda index, message: seen.append((index, message["role"])),
    )
    assert seen == [(0, "user"), (0, "assistant")]

    call = '<tool_call>\n{"name": "%s", "arguments": {"seconds": 0}}\n</tool_call><|im_end|>'
    agent = scripted_agent(tokenizer, [call % "wait", call % "shout", "done<|im_end|>"])
    (trajectory,) = agent.run([Judge()], [{"prompt": "Go."}])
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert [m["failure"] for m in tool_messages] == [None, "unknown_tool"], tool_messages
