"""Training episodes kept in flight (`GRPOConfig.keep_in_flight`): a run killed in the middle
of a step's rollouts resumes them from their snapshots when it restarts from its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from killed_runs import DYING_MODEL, HEARD_ENV

from toolgym.agents import load_jsonl
from toolgym.agents.in_flight import InFlight, InFlightStore
from toolgym.algorithms.config import GRPOConfig
from toolgym.algorithms.kept_episodes import KeptEpisodes

TESTS = Path(__file__).resolve().parent.parent

KILLED_RUN = (
    HEARD_ENV
    + DYING_MODEL
    + """
import sys

from helpers import tiny_grpo_args
from toolgym.agents import AgentLimits, ScriptedEngine
from toolgym.algorithms import GRPOTrainer
from toolgym.testing import tiny_model

output, kill_at, calls_file, resume = sys.argv[1:]
limits = AgentLimits(max_turns=4, max_new_tokens=8, max_episode_tokens=512)
args = tiny_grpo_args(
    output, max_steps=2, save_steps=1, keep_in_flight=True, save_samples=True, limits=limits
)
rows = [{"prompt": f"Talk {i}."} for i in range(3)]
trainer = GRPOTrainer(
    tiny_model(tokenizer), Heard, rows, args=args, tokenizer=tokenizer,
    engine=ScriptedEngine(script),
)
trainer.train(resume_from_checkpoint=f"{output}/checkpoint-1" if resume == "yes" else None)
"""
)


def test_a_killed_run_resumes_its_episodes_in_flight_from_their_snapshots(tmp_path):
    """Step 0 (8 generations: 2 episodes x 4 turns) is learned and checkpointed; the run is
    killed (SIGKILL) at the 13th generation, in step 1's third turns. Restarted from
    checkpoint-1, step 1's episodes go on from their last kept turn with their environments'
    state restored: only the turns left are generated, and the folder is empty at the end."""
    driver = tmp_path / "driver.py"
    driver.write_text(KILLED_RUN)
    output = tmp_path / "run"
    paths = [str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    def run(kill_at: int, calls: Path, resume: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(driver), str(output), str(kill_at), str(calls), resume]
        return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)

    first = run(13, tmp_path / "first-calls", "no")
    assert first.returncode == -9, first.stderr
    assert (output / "checkpoint-1").is_dir()
    kept = InFlightStore(output / "in-flight").kept_keys()
    assert kept == ["1.0.0.0", "1.0.0.1"]  # step 0's were forgotten once learned
    again = run(0, tmp_path / "again-calls", "yes")
    assert again.returncode == 0, again.stderr
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    step_two = [t for t in load_jsonl(output / "samples.jsonl") if t.metrics["step"] == 2]
    assert len(step_two) == 2
    resumed_at = [int(t.metrics["resumed_at_turn"]) for t in step_two]
    assert all(turn in (1, 2) for turn in resumed_at)
    generated = len((tmp_path / "again-calls").read_text().splitlines())
    assert generated == sum(4 - turn for turn in resumed_at)  # only the turns left
    for t in step_two:
        assert t.status == "max_turns" and t.reward == 4.0  # the restored state heard all 4
        assert len(t.messages) == 9
        sampled = [c for c, m in zip(t.completion_ids, t.loss_mask, strict=True) if m]
        answers = [m["content"] + "<|im_end|>" for m in t.messages if m["role"] == "assistant"]
        assert tokenizer.decode(sampled) == "".join(answers)  # the kept turns train too
    assert InFlightStore(output / "in-flight").kept_keys() == []


def _kept(store: InFlightStore, key: str, weights: int) -> None:
    store.save(key, InFlight(None, None, [], 1, {"weights": weights, "task": "t"}))  # type: ignore[arg-type]


def test_a_restart_keeps_only_unlearned_episodes_of_weights_it_has(tmp_path):
    """Restarted from step 3: episodes of steps before 3 were learned, and an episode that
    weights newer than step 3's sampled belongs to a policy the run no longer has."""
    kept = KeptEpisodes(tmp_path, lambda: 3)
    for key, weights in [("2.0.0.0", 2), ("3.0.0.0", 3), ("3.0.0.1", 2), ("4.0.0.0", 4)]:
        _kept(kept.store, key, weights)
    (tmp_path / "x.part").write_bytes(b"half")
    kept.start(3)
    assert kept.store.kept_keys() == ["3.0.0.0", "3.0.0.1"]
    kept.learned(3)
    assert kept.store.kept_keys() == []
    _kept(kept.store, "5.0.0.0", 3)
    kept.start(None)  # a new run: nothing to go on from
    assert kept.store.kept_keys() == [] and not list(tmp_path.glob("*.part"))


def test_keep_in_flight_is_refused_where_it_cannot_keep():
    from toolgym.agents import SubAgent
    from toolgym.algorithms import GRPOTrainer

    with pytest.raises(ValueError, match="branch_at_turn"):
        GRPOConfig(keep_in_flight=True, branch_at_turn=1)
    with pytest.raises(ValueError, match="sub-agents"):  # before the model named is loaded
        GRPOTrainer(
            "no-such-model",
            "Wordle-v0",
            [{}],
            args=GRPOConfig(keep_in_flight=True),
            subagents=[SubAgent()],
        )
    assert json.dumps(GRPOConfig(keep_in_flight=True).to_dict()["keep_in_flight"]) == "true"
