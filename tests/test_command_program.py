"""A command-line agent program as a rollout (issue 30 item 3): it reaches the endpoint through
`OPENAI_BASE_URL` / `OPENAI_API_KEY`, its last line is its answer, and failures and hangs end
the episode with a named status, its processes gone."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from helpers import ids, scripted_agent, wordle_rows

import toolgym
from toolgym.agents.program import command_program, program_rollout
from toolgym.testing import tiny_tokenizer

AGENT = """
import json, os, sys, time
import openai

row = json.loads(sys.stdin.read())
assert row == json.loads(os.environ["TOOLGYM_ROW"])
if sys.argv[1] == "fail":
    sys.exit("boom: the agent's own bug")
if sys.argv[1] == "hang":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
with openai.OpenAI(max_retries=0) as client:  # the endpoint, from the environment
    reply = client.chat.completions.create(model="m", messages=row["prompt"])
print("the model said:", reply.choices[0].message.content)
print(sys.argv[1])
"""


def run(tmp_path, env, rows, *args, timeout=60.0):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    agent = scripted_agent(tiny_tokenizer(), ["42<|im_end|>"], max_turns=2)
    program = command_program([sys.executable, str(script), *args])
    (played,) = agent.run([env], rows, [0], rollout_fn=program_rollout(program, timeout=timeout))
    return played


def test_a_command_plays_through_the_endpoint_and_reports_its_reward(tmp_path):
    played = run(tmp_path, toolgym.make("Wordle-v0"), wordle_rows(1), "reward: 0.25")
    assert played.status == "finished" and played.reward == 0.25
    assert played.metrics["turns"] == 1
    assert played.completion_ids == ids(tiny_tokenizer(), "42<|im_end|>")
    assert played.loss_mask == [1] * len(played.completion_ids)


def test_a_command_s_answer_goes_to_the_environment_to_grade(tmp_path):
    row = {"prompt": "What is 2 + 3?", "a": 2, "b": 3, "operation": "add"}
    right = run(tmp_path, toolgym.make("Arithmetic-v0"), [row], "5")
    wrong = run(tmp_path, toolgym.make("Arithmetic-v0"), [row], "6")
    assert (right.reward, wrong.reward) == (1.0, 0.0)


def test_a_failing_or_hanging_command_ends_with_a_named_status(tmp_path):
    failed = run(tmp_path, toolgym.make("Wordle-v0"), wordle_rows(1), "fail")
    assert failed.status == "env_error" and "boom: the agent's own bug" in failed.error
    pid_file = tmp_path / "pid"
    hung = run(
        tmp_path, toolgym.make("Wordle-v0"), wordle_rows(1), "hang", str(pid_file), timeout=3
    )
    assert hung.status == "tool_timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the hung program was left running"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
