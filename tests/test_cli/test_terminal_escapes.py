"""The terminal never receives the model's or an environment's text unescaped (issue 43 item
6): through the real CLI (`python -m toolgym play` / `eval` in a subprocess), a model that
names a tool with an OSC 52 clipboard write, writes a CSI screen clear and a window-title
sequence, and an environment whose observation, results and metric names carry the same,
leave no control sequence in what the command prints: piped (plain) or coloured as for a
terminal (rich's own SGR colours only). Before, the tool message's header printed the
model-chosen tool name raw, and so did the error line and the environment's metric names."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import ids

from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.agents.trajectory import Trajectory
from toolgym.cli.show import print_message, print_outcome
from toolgym.cli.terminal import terminal_text
from toolgym.testing import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]

CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"
"""OSC 52: write "pwned" to the clipboard."""
CLEAR = "\x1b[2J\x1b[H"
"""CSI: clear the screen, cursor home."""
TITLE = "\x1b]0;owned\x1b\\"
"""OSC 0 ended by ST: retitle the window."""
C1 = "\x9b2J"
"""CSI as one C1 byte."""

ENV = f'''
import logging
import warnings

import toolgym


class Loud(toolgym.Environment):
    """An environment whose own text carries terminal sequences (its warnings and log too)."""

    def reset(self) -> str | None:
        warnings.warn("warned " + {TITLE!r})
        logging.getLogger("loud").warning("logged %s", {CLEAR!r})
        return "observe " + {TITLE!r}

    def say(self, word: str) -> str:
        """Say a word.

        Args:
            word: The word.
        """
        return {CLEAR!r} + word

    def episode_metrics(self) -> dict[str, float]:
        return {{{TITLE!r} + "metric" + {C1!r}: 1.0}}
'''

REPLY = (
    f"{CLEAR}thinking {C1}<tool_call>\n"
    + json.dumps({"name": CLIPBOARD + TITLE, "arguments": {}})  # the name, JSON-escaped
    + "\n</tool_call><|im_end|>"
)
"""What the model writes: raw sequences in its text, and a tool name that decodes to OSC 52
and a title sequence."""

ROWS = [{"prompt": "Say something."}]


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The environment file, its dataset, and a tiny model trained until greedy decoding
    writes `REPLY` (checked teacher-forced by a margin, so no machine's kernels decide it)."""
    folder = tmp_path_factory.mktemp("hostile")
    env_file = folder / "loud_env.py"
    env_file.write_text(ENV)
    rows = folder / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    sys.path.insert(0, str(folder))
    try:
        from loud_env import Loud
    finally:
        sys.path.remove(str(folder))
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([ids(tokenizer, REPLY)])
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Loud's own warning, about its sequence
        (script,) = agent.run([Loud()], ROWS)
    assert script.messages[-1]["name"] == CLIPBOARD + TITLE  # the model chose that name
    model = _replaying(tokenizer, script)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return env_file, rows, folder / "model"


def _replaying(tokenizer, script: Trajectory):
    model = tiny_model(tokenizer, seed=1, hidden_size=64)
    sequence = torch.tensor([script.prompt_ids + script.completion_ids])
    labels = sequence.clone()
    labels[0, : len(script.prompt_ids)] = -100
    written = [len(script.prompt_ids) - 1 + i for i, m in enumerate(script.loss_mask) if m]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for step in range(1, 1501):
        model.train()
        model(sequence, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            model.eval()
            with torch.no_grad():
                logits = model(sequence).logits[0, :-1].float()[written]
            targets = sequence[0, 1:][written]
            chosen = logits.gather(1, targets[:, None])[:, 0]
            rivals = logits.scatter(1, targets[:, None], float("-inf")).max(dim=1).values
            if bool((chosen - rivals > 2.0).all()):
                print(f"the tiny model writes the hostile reply after {step} steps")
                return model.eval()
    raise AssertionError("the tiny model did not learn to write the hostile reply")


def _toolgym(*argv: str, colour: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env |= {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"} if colour else {"TERM": "dumb"}
    done = subprocess.run(
        [sys.executable, "-m", "toolgym", *argv],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stdout + stderr
    # stderr: progress bars (loading weights, eval's) redraw their line with a carriage return
    return stdout + stderr.replace("\r", "\n")


def _assert_inert(output: str, colour: bool) -> str:
    """No control character but newline and tab, except (coloured) rich's SGR colours; the
    text without those colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", output) if colour else output
    controls = sorted({c for c in text if terminal_text(c) != c})
    assert not controls, f"control characters reached the terminal: {controls}"
    return text


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.parametrize("colour", [False, True], ids=["piped", "coloured"])
def test_play_and_eval_print_no_control_sequence_from_the_model_or_the_environment(
    hostile_model, tmp_path, colour
):
    env_file, rows, model = hostile_model
    common = [f"{env_file}:Loud", "--dataset", str(rows), "--model", str(model)]
    common += ["--parser", "hermes", "--temperature", "0", "--max-turns", "1"]
    common += ["--max-new-tokens", "200"]
    played = _assert_inert(_toolgym("play", *common, colour=colour), colour)
    assert r"\x1b[2J\x1b[Hthinking \x9b2J" in played  # the person sees what was sent
    assert r"tool \x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x1b\ (failed)" in played  # its header
    assert r"\x1b]0;owned\x1b\metric\x9b2J 1" in played  # the environment's metric name
    assert r"warned \x1b]0;owned" in played and r"logged \x1b[2J" in played  # stderr
    output = tmp_path / "eval.jsonl"
    evaluated = _toolgym("eval", *common, "-n", "1", "--output", str(output), colour=colour)
    evaluated = _assert_inert(evaluated, colour)
    assert r"\x1b]0;owned\x1b\metric\x9b2J 1.00" in evaluated


def test_the_episode_printer_escapes_every_field():
    """In-process, every field the printer shows: role, tool name, contents, reasoning,
    arguments, status, error and metric names; bidirectional overrides and lone surrogates
    too (a UTF-8 stream cannot carry a surrogate: printing one would crash the command)."""
    from rich.console import Console

    hostile = CLIPBOARD + CLEAR + TITLE + C1 + "\u202e\udcff\r"
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard")
    messages = [
        {"role": hostile, "content": hostile, "reasoning_content": hostile},
        {
            "role": "assistant",
            "content": hostile,
            "tool_calls": [{"function": {"name": hostile, "arguments": {"a": hostile}}}],
        },
        {"role": "tool", "name": hostile, "content": hostile, "failure": "unknown_tool"},
    ]
    for message in messages:
        print_message(message, console)
    trajectory = Trajectory(messages=messages, status=hostile, error=hostile)
    trajectory.env_metrics = {hostile: 1.0}
    print_outcome(trajectory, console)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert not {c for c in text if terminal_text(c) != c}
    assert text.count(r"\x1b]52;c;cHduZWQ=\x07") >= 9
    text.encode("utf-8")  # no surrogate left
