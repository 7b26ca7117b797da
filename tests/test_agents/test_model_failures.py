"""What the model causes is the model's (issue 32 item 5): a failure its code or its calls cause
(time per call and per turn, too many calls, a worker it killed) ends the episode with a
status that stays in the baselines and the loss, with the reward the environment reports;
only what the model cannot cause (an engine error, a reset or a worker that never started) is
left out. `Stepper.step` never raises for a dead worker: it returns the failure."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest
from grade_once_envs import InWorker, Sleeper
from helpers import ids

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.agents.trajectory import (
    INFRASTRUCTURE_FAILURES,
    MODEL_FAILURES,
    STATUSES,
    Trajectory,
    summarize,
)
from toolgym.algorithms.advantages import group_advantages
from toolgym.sandbox import sandboxed
from toolgym.sandbox.process import ProcessBackend, ProcessLimits
from toolgym.testing import tiny_tokenizer

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"
needs_bwrap = pytest.mark.skipif(
    not REQUIRED and shutil.which("bwrap") is None,
    reason="bubblewrap is not installed (apt-get install bubblewrap; scripts/sandbox_setup.sh)",
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def reply(*calls: tuple[str, dict]) -> str:
    """An assistant turn (hermes format) making these calls."""
    blocks = "".join(
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>\n"
        for name, arguments in calls
    )
    return blocks + "<|im_end|>"


def play(tokenizer, env, text: str, row: dict | None = None, **limits) -> Trajectory:
    """One episode whose model writes `text` every turn."""
    engine = ScriptedEngine([ids(tokenizer, text)], context_length=1_000_000)
    settings = {"max_turns": 1, "max_new_tokens": 500_000, "max_episode_tokens": 900_000}
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(**settings | limits))
    (trajectory,) = agent.run([env], [{"prompt": "go", **(row or {})}])
    print(f"{trajectory.status}: {trajectory.error} (reward {trajectory.reward})")
    return trajectory


def in_the_loss(trajectories: list[Trajectory]) -> list[bool]:
    """Which trajectories enter the loss, as the trainers decide (`Trajectory.failed`, then
    `group_advantages`), in one group."""
    rewards = [t.reward for t in trajectories]
    _, used = group_advantages(rewards, [not t.failed for t in trajectories], len(rewards))
    return used.tolist()


def test_the_statuses_are_split_between_the_model_and_the_infrastructure():
    assert {"tool_timeout", "tool_crash", "too_many_calls"} == MODEL_FAILURES
    assert {"env_error", "engine_error", "judge_error"} == INFRASTRUCTURE_FAILURES
    assert set(STATUSES) >= MODEL_FAILURES | INFRASTRUCTURE_FAILURES
    assert not Trajectory(status="tool_crash").failed
    assert Trajectory(status="engine_error").failed


def test_a_call_past_its_own_time_limit_is_the_model_s(tokenizer):
    slept = play(tokenizer, Sleeper(), reply(("sleep", {"seconds": 5})), tool_call_timeout=0.3)
    assert slept.status == "tool_timeout" and "time limit of one tool call" in slept.error
    assert slept.metrics["tool_seconds"] < 2.0
    assert "Error: sleep took over 0.3 s" in slept.messages[-1]["content"]
    assert not slept.failed


def test_calls_that_add_up_past_the_turn_s_limit_are_the_model_s(tokenizer):
    """Four sleeps, each under the per-call limit, past the turn's (as four `time.sleep(9)`
    under a 10 s run limit pass a 30 s turn)."""
    four = reply(*[("sleep", {"seconds": 0.4})] * 4)
    slept = play(tokenizer, Sleeper(), four, tool_call_timeout=0.5, tool_timeout=1.0)
    assert slept.status == "tool_timeout" and "turn's time limit" in slept.error
    contents = [m["content"] for m in slept.messages if m["role"] == "tool"]
    assert contents[:2] == ["slept", "slept"] and "turn's time limit" in contents[2]
    assert "the episode is over" in contents[3]
    assert slept.metrics["tool_seconds"] < 1.8


def test_a_turn_over_the_call_cap_runs_nothing_and_is_the_model_s(tokenizer):
    many = reply(*[("sleep", {"seconds": 0.2})] * 200)
    capped = play(tokenizer, Sleeper(), many)
    assert capped.status == "too_many_calls" and "200 tool calls" in capped.error
    assert "at most 32" in capped.error and capped.metrics["tool_seconds"] < 0.5
    loose = play(tokenizer, Sleeper(), reply(*[("sleep", {"seconds": 0.0})] * 3))
    assert loose.status == "max_turns"  # under the cap: the calls ran


def test_engine_errors_and_failed_resets_stay_excluded(tokenizer):
    class BrokenReset(toolgym.Environment):
        def reset(self) -> str | None:
            raise RuntimeError("database down")

    def failing(prompt_ids):
        raise ConnectionError("engine gone")

    broken = play(tokenizer, BrokenReset(), "hi<|im_end|>")
    agent = Agent(ScriptedEngine(failing), tokenizer, parser="hermes")
    (gone,) = agent.run([Sleeper()], [{"prompt": "go"}])
    assert (broken.status, gone.status) == ("env_error", "engine_error")
    assert broken.failed and gone.failed


@needs_bwrap
def test_a_dead_worker_is_a_step_result_not_an_exception():
    """A worker the call killed: `tool_crash` (the model's); a worker already gone before
    the call: `env_error`; neither raises."""
    env = sandboxed(InWorker, {}, "process", call_timeout=5.0)
    try:
        env.reset(seed=0)
        assert (
            env.step(toolgym.ToolCall("run", {"code": "result = 6 * 7"})).messages[0]["content"]
            == "42"
        )
        step = env.step(toolgym.ToolCall("run", {"code": "import os; os._exit(3)"}))
        assert step.terminated and step.info["ended"] == "tool_crash"
        assert step.results[0].failure == "tool_crash" and "exit code 3" in step.info["error"]
        assert (
            "the episode is over"
            in env.step(toolgym.ToolCall("run", {"code": "1"})).messages[0]["content"]
        )
        env.reset(seed=1)  # a fresh worker
        env.executor.channel.kill()  # gone before the model's call: not the model's doing
        step = env.step(toolgym.ToolCall("run", {"code": "result = 1"}))
        assert step.info["ended"] == "env_error" and step.results[0].failure == "env_error"
    finally:
        env.close()


@needs_bwrap
def test_every_route_through_a_process_sandbox_ends_in_the_loss(tokenizer):
    """Through the agent, with real process sandboxes: the model's code allocating far past
    the memory limit (the sandbox holds: the model reads a MemoryError), killing its worker,
    a worker killed from outside during the model's call (as the kernel's OOM killer would),
    a call past the sandbox's own request limit, a call past the agent's per-call limit, a
    turn past its limit; then an engine error and a failed reset. The model's outcomes all
    enter the group's baseline and the loss; the last two do not."""
    backend = ProcessBackend(limits=ProcessLimits(memory_bytes=1 << 30))
    outcomes: dict[str, Trajectory] = {}

    repl = toolgym.make("PythonREPL-v0", sandbox=backend)
    try:
        hog = reply(("run", {"code": "x = bytearray(8 << 30)"}))
        outcomes["memory"] = play(tokenizer, repl, hog, {"task": "t", "answer": "1"})
        sleep = reply(("run", {"code": "import time; time.sleep(5)"}))
        outcomes["call limit"] = play(tokenizer, repl, sleep, tool_call_timeout=0.5)
        naps = reply(*[("run", {"code": "import time; time.sleep(0.4)"})] * 4)
        outcomes["turn limit"] = play(tokenizer, repl, naps, tool_timeout=1.0)
    finally:
        repl.close()

    worker = sandboxed(InWorker, {}, backend, call_timeout=1.0)
    try:
        outcomes["exit"] = play(
            tokenizer, worker, reply(("run", {"code": "import os; os._exit(3)"}))
        )
        outcomes["sandbox limit"] = play(
            tokenizer, worker, reply(("run", {"code": "while True: pass"}))
        )
        killer = threading.Timer(0.5, lambda: worker.executor.channel.kill())
        killer.start()
        outcomes["killed"] = play(
            tokenizer, worker, reply(("run", {"code": "import time; time.sleep(3)"}))
        )
        killer.join()
    finally:
        worker.close()

    class BrokenReset(toolgym.Environment):
        def reset(self) -> str | None:
            raise RuntimeError("the worker never started")

    outcomes["failed reset"] = play(tokenizer, BrokenReset(), "hi<|im_end|>")
    agent = Agent(ScriptedEngine(lambda p: 1 / 0), tokenizer, parser="hermes")
    (outcomes["engine"],) = agent.run([Sleeper()], [{"prompt": "go"}])

    statuses = {route: t.status for route, t in outcomes.items()}
    print(statuses)
    assert statuses == {
        "memory": "max_turns",
        "call limit": "tool_timeout",
        "turn limit": "tool_timeout",
        "exit": "tool_crash",
        "sandbox limit": "tool_timeout",
        "killed": "tool_crash",
        "failed reset": "env_error",
        "engine": "engine_error",
    }
    assert "MemoryError" in outcomes["memory"].messages[-1]["content"]
    used = dict(zip(outcomes, in_the_loss(list(outcomes.values())), strict=True))
    assert used == {route: route not in ("failed reset", "engine") for route in outcomes}
    summary = summarize(list(outcomes.values()))
    assert summary["statuses"] == {
        "max_turns": 1,
        "tool_timeout": 3,
        "tool_crash": 2,
        "env_error": 1,
        "engine_error": 1,
    }
    assert all(t.reward == 0.0 for t in outcomes.values())


def test_the_trainer_keeps_the_model_s_failures_in_the_loss_and_logs_them(tmp_path):
    """GRPO end to end: episodes whose tool calls run past the per-call limit stay in the
    step (not `excluded`), a failed reset is excluded; the step's metrics count each status.
    The model writes a turn, then its call is made for it (a rollout function), so the test
    does not depend on what a tiny random model writes."""
    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.testing import tiny_model

    async def write_then_guess(ctx, env):
        trajectory = ctx.start()
        await ctx.generate(trajectory)
        await ctx.step(toolgym.ToolCall("guess", {"word": "crane"}))
        return trajectory

    class SlowGuess(toolgym.Environment):
        resets = 0

        def reset(self, answer: str = "") -> str | None:
            SlowGuess.resets += 1
            if SlowGuess.resets % 3 == 0:
                raise RuntimeError("backend down")
            return None

        def guess(self, word: str) -> str:
            """Guess.

            Args:
                word: A word.
            """
            time.sleep(2.0)  # as the model's code would
            return "ok"

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        prompts_per_step=2,
        num_generations=3,
        micro_batch_size=4,
        limits=AgentLimits(
            max_turns=3, max_new_tokens=8, max_episode_tokens=400, tool_call_timeout=0.2
        ),
        parser="hermes",
        progress_bar=False,
    )
    rows = list(toolgym.spec("Wordle-v0").dataset(2, seed=0))
    trainer = GRPOTrainer(
        model, SlowGuess, rows, args=args, tokenizer=tokenizer, rollout_fn=write_then_guess
    )
    (metrics,) = trainer.train()
    print(metrics["statuses"], "excluded", metrics["excluded"])
    assert metrics["statuses"] == {"tool_timeout": 4, "env_error": 2}
    assert metrics["excluded"] == 2


class ShapedSleeper(Sleeper):
    """A shaped reward the model already holds before its call fails."""

    def reset(self) -> str | None:
        self.reward = 0.5
        return "Sleep."


def test_a_model_failure_keeps_the_environment_s_reward_or_the_set_penalty(tokenizer):
    """By default the model's failure is scored with the environment's last reward; where
    failing could pay more than a wrong answer, `model_failure_reward` replaces it."""
    slow = reply(("sleep", {"seconds": 2}))
    kept = play(tokenizer, ShapedSleeper(), slow, tool_call_timeout=0.2)
    penalised = play(
        tokenizer, ShapedSleeper(), slow, tool_call_timeout=0.2, model_failure_reward=-1.0
    )
    assert (kept.status, kept.reward) == ("tool_timeout", 0.5)
    assert (penalised.status, penalised.reward) == ("tool_timeout", -1.0)
    answered = play(tokenizer, ShapedSleeper(), "done<|im_end|>", model_failure_reward=-1.0)
    assert (answered.status, answered.reward) == ("finished", 0.5)  # not a failure: untouched


def test_the_penalty_is_a_cli_flag():
    import argparse

    parser = argparse.ArgumentParser()
    AgentLimits.add_arguments(parser)
    assert AgentLimits.from_arguments(parser.parse_args([])).model_failure_reward is None
    args = parser.parse_args(["--model-failure-reward", "-1"])
    assert AgentLimits.from_arguments(args).model_failure_reward == -1.0


def test_parsing_runs_off_the_event_loop(tokenizer):
    """A long hostile message must not stall the other episodes: the parser runs in a thread,
    where no event loop is running."""
    import asyncio

    from toolgym.agents.parsers import ParsedMessage

    seen = []

    def parser(text: str) -> ParsedMessage:
        try:
            asyncio.get_running_loop()
            seen.append("on the event loop")
        except RuntimeError:
            seen.append("in a thread")
        return ParsedMessage(text)

    agent = Agent(ScriptedEngine([ids(tokenizer, "hi<|im_end|>")]), tokenizer, parser=parser)
    (trajectory,) = agent.run([Sleeper()], [{"prompt": "go"}])
    assert trajectory.status == "finished" and seen == ["in a thread"]
