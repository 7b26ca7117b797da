"""GRPO steps on two CPU processes; run by tests/test_algorithms/test_distributed.py through
`accelerate launch --num_processes 2 --cpu`. Each process writes what it saw to
`<output>/rank<N>.json`: its rollouts' rewards, the advantages its last update used, every
step's logged reward, and a checksum of the weights at the end.

    two_process_grpo.py OUTPUT [STEPS] [--resume CHECKPOINT] [--hang-at STEP]

`--hang-at STEP` writes `<output>/hanging` at the start of that step and waits (to be killed).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import toolgym
from toolgym.agents import AgentLimits
from toolgym.algorithms import GRPOConfig, GRPOTrainer
from toolgym.testing import tiny_model, tiny_tokenizer


def completion_reward(prompts, completions, trajectories, **_):
    """Differs from rollout to rollout (it hashes the sampled tokens)."""
    return [(sum(t.completion_ids) % 101) / 100 for t in trajectories]


def half(prompts, completions, trajectories, **_):
    """A second reward source, so that `rewards/<source>` is logged."""
    return [0.5] * len(trajectories)


class RecordingTrainer(GRPOTrainer):
    """Keeps the advantages each process hands to its update; can hang at a given step."""

    hang_at: int | None = None

    def training_step(self):
        if self.step + 1 == self.hang_at:
            (Path(self.args.output_dir) / "hanging").write_text(str(self.step + 1))
            time.sleep(600)
        return super().training_step()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        update = self.learner.update

        def recording_update(trajectories, advantages, used, used_everywhere, turn_credit=None):
            self.seen = {
                "rewards": [t.reward for t in trajectories],
                "completion_rewards": completion_reward(None, None, trajectories),
                "advantages": advantages.tolist(),
                "used_everywhere": used_everywhere,
            }
            return update(trajectories, advantages, used, used_everywhere, turn_credit)

        self.learner.update = recording_update


def main(output: Path, steps: int, resume: str | None, hang_at: int | None) -> None:
    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(output),
        max_steps=steps,
        prompts_per_step=1,
        num_generations=4,
        micro_batch_size=2,
        limits=AgentLimits(max_turns=2, max_new_tokens=12, max_episode_tokens=400),
        parser="hermes",
        env_reward=False,
        learning_rate=1e-2,
        progress_bar=False,
        save_steps=1,
        batch_wait=60.0,  # batches that do not depend on timing: a resumed run samples the same
    )
    rows = list(toolgym.spec("Wordle-v0").dataset(4, seed=0))
    trainer = RecordingTrainer(
        tiny_model(tokenizer, seed=3),
        "Wordle-v0",
        rows,
        reward_funcs=[completion_reward, half],
        args=args,
        tokenizer=tokenizer,
    )
    trainer.hang_at = hang_at
    history = trainer.train(resume_from_checkpoint=resume)
    rank = trainer.accelerator.process_index
    weights = sum(float(p.detach().double().sum()) for p in trainer.learner.policy.parameters())
    record = {
        **trainer.seen,
        "processes": trainer.accelerator.num_processes,
        "step_reward": history[-1]["reward"],
        "logged_completion_reward": history[-1]["rewards/completion_reward"],
        "step_rewards": {
            str(trainer.step - len(history) + 1 + i): m["reward"] for i, m in enumerate(history)
        },
        "weights": weights,
    }
    (output / f"rank{rank}.json").write_text(json.dumps(record))
    # Tear the gloo group down before exit: left to interpreter shutdown, its threads can abort
    # the process ("terminate called without an active exception") after the work is done.
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    options = sys.argv[1:]
    resume = options[options.index("--resume") + 1] if "--resume" in options else None
    hang = int(options[options.index("--hang-at") + 1]) if "--hang-at" in options else None
    positional = [
        o
        for i, o in enumerate(options)
        if not o.startswith("--") and (i == 0 or not options[i - 1].startswith("--"))
    ]
    main(Path(positional[0]), int(positional[1]) if len(positional) > 1 else 1, resume, hang)
