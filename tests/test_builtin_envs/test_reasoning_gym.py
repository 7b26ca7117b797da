"""reasoning-gym's tasks, used unchanged: registered as `reasoning-gym/<task>`, scored by the
package's own scorers, held out by seed, evaluated with `toolgym eval`, trained one GRPO step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import one_grpo_step

pytest.importorskip("reasoning_gym")

import toolgym
from toolgym.builtin_envs.reasoning_gym import extract_answer
from toolgym.cli import main

TASKS = ["basic_arithmetic", "spell_backward", "gcd"]


def first_row(task: str, split: str = "test") -> dict:
    return toolgym.spec(f"reasoning-gym/{task}").dataset(2, seed=0, split=split)[0]


@pytest.mark.parametrize("task", TASKS)
def test_the_tasks_own_answer_scores_one_and_a_wrong_one_less(task):
    env = toolgym.make(f"reasoning-gym/{task}")
    row = first_row(task)
    assert env.tools == [] and row["prompt"][-1]["content"]  # final-answer only; the question
    assert env.reset(seed=0, **row) is None  # the row's prompt already holds the question
    entry = env.unwrapped.entry
    assert entry["question"] == row["prompt"][-1]["content"]
    env.final_answer(f"<think>easy</think>Done: <answer>{entry['answer']}</answer>")
    assert env.get_reward() == 1.0 and env.done
    env.reset(seed=0, **row)
    env.final_answer("<answer>certainly not the answer</answer>")
    assert env.get_reward() < 1.0 and env.done
    assert env.unwrapped.episode_metrics() == {"answer_tagged": 1.0}


def test_answer_extraction():
    assert extract_answer("a <answer>1</answer> b <answer> 2 </answer>") == ("2", True)
    assert extract_answer("<think>7?</think>\n 8 \n") == ("8", False)
    assert extract_answer("8", require_tags=True) == (None, False)


def test_a_scorer_that_cannot_read_the_answer_gives_zero():
    env = toolgym.make("reasoning-gym/prime_factorization")
    env.reset(seed=0, **first_row("prime_factorization"))
    env.final_answer("no idea")  # its scorer raises ValueError on this
    assert env.get_reward() == 0.0 and env.done


def test_without_a_row_reset_draws_a_problem_and_shows_it():
    env = toolgym.make("reasoning-gym/basic_arithmetic")
    shown = env.reset(seed=5)
    assert shown.startswith(env.unwrapped.entry["question"]) and "<answer>" in shown
    assert env.reset(seed=5) == shown


def test_train_and_test_rows_are_disjoint_and_reproducible():
    spec = toolgym.spec("reasoning-gym/basic_arithmetic")
    train, test = spec.dataset(40, seed=0), spec.dataset(40, seed=0, split="test")
    assert spec.dataset(40, seed=0)["prompt"] == train["prompt"]
    generators = [{r["dataset_seed"] + r["index"] for r in rows} for rows in (train, test)]
    assert not generators[0] & generators[1]  # each entry is Random(dataset_seed + index)
    questions = [{r["prompt"][-1]["content"] for r in rows} for rows in (train, test)]
    assert not questions[0] & questions[1]
    with pytest.raises(ValueError, match="split"):
        spec.dataset(2, split="validation")


def test_ids_are_listed_and_importing_toolgym_does_not_import_the_package():
    ids = toolgym.list_envs(namespace="reasoning-gym")
    assert "reasoning-gym/basic_arithmetic" in ids and "reasoning-gym/composite" not in ids
    assert len(ids) > 90
    code = (
        "import sys, toolgym\n"
        "toolgym.make('Wordle-v0')\n"
        "try:\n    toolgym.make('Wordl-v0')\nexcept KeyError:\n    pass\n"
        "print('reasoning_gym' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.strip() == "False", loaded.stderr


def test_a_scripted_agent_answers_through_a_rollout():
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    row = first_row("spell_backward")
    env = toolgym.make("reasoning-gym/spell_backward")
    env.reset(seed=0, **row)
    reply = f"<answer>{env.unwrapped.entry['answer']}</answer><|im_end|>"
    agent = scripted_agent(tiny_tokenizer(), [reply], max_turns=1)
    (trajectory,) = agent.run([env], [row])
    assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant"]
    assert trajectory.status == "finished" and trajectory.reward == 1.0


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model and its tokenizer, saved as a folder."""
    from toolgym.testing import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_toolgym_eval_on_held_out_rows(model_folder, capsys):
    argv = ["eval", "reasoning-gym/basic_arithmetic", "--model", str(model_folder), "-n", "8"]
    argv += ["--split", "test", "--max-new-tokens", "8", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 8 and sum(summary["statuses"].values()) == 8
    assert summary["statuses"].get("env_error", 0) == 0
    assert 0.0 <= summary["reward"] < 1.0  # a random model


def test_grpo_trains_one_step_on_a_task(tmp_path):
    task = "reasoning-gym/basic_arithmetic"
    rows = toolgym.spec(task).dataset(2, seed=0)
    metrics = one_grpo_step(task, rows, tmp_path, max_turns=1, max_new_tokens=8, max_tokens=400)
    assert metrics["statuses"].get("env_error", 0) == 0
    assert "loss" in metrics and 0.0 <= metrics["reward"] <= 1.0
