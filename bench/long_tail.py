"""Partial rollouts against the drain, on a long-tail workload (`bench/rollout.py --workload
long-tail`).

GRPO training with vLLM on the synthetic random tiny model (every turn 48 tokens, every turn
a `wait` call): a quarter of the prompts play 20 turns, the others 2, so a few episodes of
each step are 10x longer than the median. Three arms train the same steps from the same
weights on one engine, in one run:

- `on-policy`: `max_staleness=0` (each step's rollouts after the update before it);
- `drain`: `max_staleness=1`, `partial_rollouts=False` (a step's episodes start once every
  episode of the step before has ended; an update waits for the requests generating);
- `partial`: `max_staleness=1`, `partial_rollouts=True` (steps overlap; an update stops the
  running requests and resumes them on the new weights).

The on-policy arm runs first and also warms the engine; drain and partial then alternate
`repeats` times, and their figures are the means over the repeats.

Printed per arm: the wall time of `train()` (every step, the final checkpoint included), model
tokens/s over it, the mean step time (steps after the first), token staleness and the share
of episodes played by two weights; then the ratios against the drain.
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

from rollout import VaryingLengths, always_wait, synthetic_model
from run_folder import run_folder

import toolgym
from toolgym.agents import AgentLimits
from toolgym.agents.trajectory import load_jsonl
from toolgym.algorithms import GRPOConfig, GRPOTrainer

LONG_TURNS, SHORT_TURNS, TURN_TOKENS = 20, 2, 48
_ENDED = itertools.count()  # rewards that differ within a group, so every update has signal


class LongTailGame(toolgym.Environment):
    """`wait` until the episode's turns are used: 20 for every fourth row, else 2."""

    def reset(self, index: int = 0) -> str | None:
        self.turns_left = LONG_TURNS if index % 4 == 0 else SHORT_TURNS
        return f"Episode {index}: call wait."

    def wait(self) -> str:
        """Wait for the world."""
        self.turns_left -= 1
        if self.turns_left <= 0:
            self.done = True
            self.reward = next(_ENDED) % 7 / 7
        return "waited"


ARMS = {
    "on-policy": {"max_staleness": 0},
    "drain": {"max_staleness": 1, "partial_rollouts": False},
    "partial": {"max_staleness": 1, "partial_rollouts": True},
}


def long_tail(
    steps: int = 8, prompts: int = 4, group: int = 4, repeats: int = 2
) -> dict[str, dict[str, float]]:
    """Each arm's figures (see the module docstring)."""
    from toolgym.agents import VLLMEngine

    tokenizer, model, folder = synthetic_model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    base = VLLMEngine(folder, context_length=4096, dtype="float32")
    engine = VaryingLengths(base, (TURN_TOKENS, TURN_TOKENS))
    rows = [{"prompt": "Play.", "index": i} for i in range(steps * prompts)]
    try:
        order = ["on-policy"] + ["drain", "partial"] * repeats
        runs: dict[str, list[dict[str, float]]] = {}
        for name in order:
            settings = ARMS[name]
            model.load_state_dict(initial)
            base.update_weights(initial)
            overlapping = settings["max_staleness"] > 0 and settings.get("partial_rollouts", True)
            base.in_flight_updates = "continue" if overlapping else "finish"
            output = run_folder("toolgym-long-tail-")
            args = GRPOConfig(
                output_dir=output,
                max_steps=steps,
                prompts_per_step=prompts,
                num_generations=group,
                micro_batch_size=8,
                limits=AgentLimits(
                    max_turns=LONG_TURNS, max_new_tokens=64, max_episode_tokens=4096
                ),
                learning_rate=1e-5,
                progress_bar=False,
                save_steps=0,
                **settings,
            )
            trainer = GRPOTrainer(
                model, LongTailGame, rows, args=args, tokenizer=tokenizer, engine=engine
            )
            trainer.agent.parse = always_wait
            started = time.perf_counter()
            history = trainer.train()
            wall = time.perf_counter() - started
            tokens = sum(t.model_tokens for t in load_jsonl(Path(output) / "samples.jsonl"))
            runs.setdefault(name, []).append(
                {
                    "seconds": wall,
                    "tokens_per_second": tokens / wall,
                    "step_seconds": statistics.mean(m["step_seconds"] for m in history[1:]),
                    "token_staleness": statistics.mean(m["token_staleness"] for m in history),
                    "mixed": statistics.mean(m["mixed_policy_episodes"] for m in history),
                }
            )
            f = runs[name][-1]
            print(
                f"{name:9} {len(history)} steps in {wall:6.1f} s: {tokens} model tokens, "
                f"{f['tokens_per_second']:6.1f} tokens/s, step {f['step_seconds']:5.2f} s, "
                f"token staleness {f['token_staleness']:.2f}, mixed episodes {f['mixed']:.2f}",
                flush=True,
            )
    finally:
        base.close()
    return {
        name: {key: statistics.mean(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }
