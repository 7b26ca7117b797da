"""Graders grade once (issue 32 item 4): an environment that is done answers later calls as
over and never grades again, through the environment API (`step`, `inline_step`,
`final_answer`), locally and in a sandbox worker (where the host's `Stepper` refuses first and
the worker's own `LocalExecutor` refuses what reaches it anyway)."""

from __future__ import annotations

import os
import shutil

import pytest
from grade_once_envs import Quiz

import toolgym
from toolgym.sandbox import sandboxed

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"
needs_bwrap = pytest.mark.skipif(
    not REQUIRED and shutil.which("bwrap") is None,
    reason="bubblewrap is not installed (apt-get install bubblewrap; scripts/sandbox_setup.sh)",
)
WHERE = ["local", pytest.param("process", marks=needs_bwrap)]


def _over(text: str) -> bool:
    return "the episode is over" in text


@pytest.mark.parametrize("where", WHERE)
def test_python_lines_grades_the_first_submit_only(where):
    env = toolgym.make("PythonLines-v0", sandbox=where)
    try:
        env.reset(seed=0, task="t", answer="42")
        first = env.inline_step("submit(1)\n")
        assert first.done and env.done and env.reward == 0.0
        second = env.inline_step("submit(42)\n")
        assert second.done and second.failed and _over(second.observation)
        env.final_answer("submit(42)")  # a last line after the end does not run either
        assert env.reward == 0.0
        env.reset(seed=1, task="t", answer="42")  # the next episode grades again
        assert env.inline_step("submit(42)\n").done and env.reward == 1.0
        assert _over(env.inline_step("submit(1)\n").observation) and env.reward == 1.0
    finally:
        env.close()


@pytest.mark.parametrize("where", WHERE)
def test_python_repl_grades_the_first_answer_only(where):
    env = toolgym.make("PythonREPL-v0", sandbox=where)
    try:
        env.reset(seed=0, task="t", answer="42")
        env.final_answer("1")
        assert env.done and env.reward == 0.0
        env.final_answer("42")
        assert env.reward == 0.0
        step = env.step(toolgym.ToolCall("run", {"code": "print(1)"}))
        assert step.results[0].failure == "episode_over" and _over(step.messages[0]["content"])
        assert step.reward == 0.0 and env.reward == 0.0
    finally:
        env.close()


def test_the_environments_own_methods_refuse_after_done():
    """Defence in depth: called directly (no Stepper in between), the built-ins refuse too."""
    lines_env = toolgym.make("PythonLines-v0", sandbox="local")
    repl_env = toolgym.make("PythonREPL-v0", sandbox="local")
    lines, repl = lines_env.unwrapped, repl_env.unwrapped
    try:
        lines_env.reset(seed=0, task="t", answer="42")
        assert type(lines).inline_step(lines, "submit(1)\n").done
        assert _over(type(lines).inline_step(lines, "submit(42)\n").observation)
        assert lines._submit("42").failed and lines.reward == 0.0
        repl_env.reset(seed=0, task="t", answer="42")
        type(repl).final_answer(repl, "1")
        type(repl).final_answer(repl, "42")
        assert repl.done and repl.reward == 0.0
        with pytest.raises(toolgym.ToolError, match="the episode is over"):
            repl.run("print(1)")
    finally:
        lines_env.close()
        repl_env.close()


@pytest.mark.parametrize("where", WHERE)
def test_an_ends_episode_tool_grades_once(where):
    env = sandboxed(Quiz, {}, where)
    try:
        env.reset(seed=0, answer="42")
        first = env.step(toolgym.ToolCall("submit", {"answer": "1"}))
        assert first.terminated and first.info["answered"] and env.reward == 0.0
        second = env.step(
            [toolgym.ToolCall("submit", {"answer": "42"}), toolgym.ToolCall("note", {"text": "x"})]
        )
        assert [r.failure for r in second.results] == ["episode_over", "episode_over"]
        assert all(_over(m["content"]) for m in second.messages)
        assert second.reward == 0.0 and env.reward == 0.0 and second.terminated
        env.final_answer("42")  # an answer in text after the end changes nothing either
        assert env.reward == 0.0
        env.reset(seed=1, answer="42")
        assert env.step(toolgym.ToolCall("submit", {"answer": "42"})).reward == 1.0
    finally:
        env.close()


@needs_bwrap
def test_a_sandbox_worker_refuses_what_reaches_it_after_the_end():
    """The host's Stepper refuses first; requests sent to the worker past it (as a broken or
    forged host would) are refused by the worker's own executor."""
    quiz = sandboxed(Quiz, {}, "process")
    lines = toolgym.make("PythonLines-v0", sandbox="process")
    repl = toolgym.make("PythonREPL-v0", sandbox="process")
    try:
        quiz.reset(seed=0, answer="42")
        quiz.step(toolgym.ToolCall("submit", {"answer": "1"}))
        again = quiz.executor.request("call", name="submit", arguments={"answer": "42"})
        assert again["failure"] == "episode_over" and quiz.executor.reward() == 0.0
        assert quiz.executor.request("invoke", name="get_reward") == 0.0

        lines.reset(seed=0, task="t", answer="42")
        lines.inline_step("submit(1)\n")
        step = lines.executor.request("invoke", name="inline_step", args=["submit(42)\n"])
        assert _over(step["observation"]) and lines.executor.reward() == 0.0

        repl.reset(seed=0, task="t", answer="42")
        repl.final_answer("1")
        repl.executor.request("invoke", name="final_answer", args=["42"])
        assert repl.executor.reward() == 0.0
        ran = repl.executor.request("call", name="run", arguments={"code": "print(1)"})
        assert ran["failure"] == "episode_over"
    finally:
        for env in (quiz, lines, repl):
            env.close()
