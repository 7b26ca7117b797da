"""Episodes that are not one growing sequence: several user turns, and context compaction.

A trajectory is a graph of samples (`Trajectory.samples`, each with its `parent` and `role`):
one sample for an episode played as one sequence, one more wherever the episode goes on from
a prompt that is not the sequence before it. This example plays one GRPO step of each shape
and prints the graph and the step's figures:

- **several user turns**: `ShoppingList`'s user asks for one item per turn, then for the list
  (`Environment.user_turn`); with a prefix-preserving template the user's turns are appended
  as tokens (mask 0) and the episode stays one sample;
- **compaction**: Wordle with a context budget (`GRPOConfig.compact_at_tokens`): past it the
  turns between the task and the latest one are dropped (the known-letters line of the latest
  feedback keeps the game's state) and the episode goes on in a new sample; with `--summary`
  the model first writes a summary, a trained sample of its own.

    python examples/sample_graph.py             # SmolLM2-135M on the CPU (about 2 minutes)
    python examples/sample_graph.py --model runs/wordle/checkpoint-12   # a trained player
    python examples/sample_graph.py --tiny      # a tiny random model: only the mechanics
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import toolgym
from toolgym.agents import AgentLimits, Trajectory, load_jsonl

ITEMS = (
    "apples",
    "bread",
    "butter",
    "cheese",
    "eggs",
    "flour",
    "milk",
    "onions",
    "pasta",
    "rice",
    "soap",
    "tea",
)
"""What the user may want on the list."""

SYSTEM = (
    "You keep the user's shopping list. Add each item the user asks for with the add_item "
    "tool, then say that it is done. When the user asks what is on the list, answer with the "
    "items only, separated by commas."
)


class ShoppingList(toolgym.Environment):
    """A user who asks for one item per turn, then for the whole list.

    The first user turn asks for the first item; after each answer without a tool call the
    user asks for the next (`user_turn`), and last for the list. Reward: a point per wanted
    item on the list, and one for a last answer that names exactly the list's items (all the
    wanted ones), out of the items + 1.
    """

    max_turns = 12

    def reset(self, items: list[str]) -> str:
        """Start with the wanted `items` (the first is asked for at once)."""
        self.wanted = [str(item).lower() for item in items]
        self.items: list[str] = []
        self.requests = [f"Thanks. Please also add {item}." for item in self.wanted[1:]]
        self.requests.append("What is on my list now?")
        self.asked = 1
        return f"Please add {self.wanted[0]} to my shopping list."

    def add_item(self, item: str) -> str:
        """Add an item to the shopping list.

        Args:
            item: The item, e.g. "milk".
        """
        name = item.strip().lower()
        if name in self.items:
            return f"{name} is already on the list."
        self.items.append(name)
        self.reward = self._score(named_all=False)
        return f"Added {name}; the list has {len(self.items)} item(s)."

    def user_turn(self, answer: str) -> str | None:
        """The user's next request, or None once the list was asked for."""
        if not self.requests:
            return None
        self.asked += 1
        return self.requests.pop(0)

    def final_answer(self, text: str) -> None:
        """Grade the answer to "what is on my list"."""
        named = {part.strip().strip(".").lower() for part in text.split(",") if part.strip()}
        exact = named == set(self.items) == set(self.wanted)
        self.reward = self._score(named_all=exact)
        self.done = True

    def episode_metrics(self) -> dict[str, float]:
        """Items the user asked for that are on the list, and the user turns reached."""
        return {
            "items_on_list": float(len(set(self.items) & set(self.wanted))),
            "user_turns": float(self.asked),
        }

    def _score(self, named_all: bool) -> float:
        on_list = len(set(self.items) & set(self.wanted))
        return (on_list + named_all) / (len(self.wanted) + 1)


def shopping_rows(count: int, seed: int = 0, items: int = 2) -> list[dict[str, Any]]:
    """`count` rows of `items` distinct wanted items each, with the system prompt."""
    rng = random.Random(seed)
    prompt = [{"role": "system", "content": SYSTEM}]
    return [{"prompt": prompt, "items": rng.sample(ITEMS, items)} for _ in range(count)]


def describe(trajectory: Trajectory) -> str:
    """One line per sample: its parent, its prompt, sampled and observation tokens."""
    lines = []
    for index, sample in enumerate(trajectory.samples):
        sampled = sum(sample.loss_mask)
        observed = len(sample.completion_ids) - sampled
        lines.append(
            f"    sample {index} (parent {sample.parent}, role {sample.role}): prompt "
            f"{len(sample.prompt_ids)}, sampled {sampled}, observation {observed} tokens"
        )
    return "\n".join(lines)


def one_step(
    model: Any, tokenizer: Any, env: Any, rows: list[dict[str, Any]], **config: Any
) -> None:
    """One GRPO step on `rows` (one group), timed; the step's figures and its first episode's
    sample graph."""
    from toolgym.algorithms import GRPOConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as output_dir:
        args = GRPOConfig(
            output_dir=output_dir,
            max_steps=1,
            prompts_per_step=1,
            num_generations=len(rows),
            micro_batch_size=len(rows),
            temperature=1.0,
            save_steps=0,
            progress_bar=False,
            **config,
        )
        trainer = GRPOTrainer(model, env, rows, args=args, tokenizer=tokenizer)
        started = time.perf_counter()
        try:
            (metrics,) = trainer.train()
        finally:
            trainer.close()
        seconds = time.perf_counter() - started
        trajectories = load_jsonl(Path(output_dir) / "samples.jsonl")
    trajectory = trajectories[0]
    samples = sum(len(t.samples) for t in trajectories) / len(trajectories)
    compactions = sum(t.metrics.get("compactions", 0.0) for t in trajectories) / len(trajectories)
    print(
        f"  one GRPO step of {len(rows)} episodes: {seconds:.1f} s; reward "
        f"{metrics['reward']:.3f}; samples per episode {samples:.2f}; compactions per "
        f"episode {compactions:.2f}; sampled tokens {sum(t.model_tokens for t in trajectories)}, "
        f"observation tokens {sum(t.observation_tokens for t in trajectories)}; statuses "
        f"{metrics['statuses']}"
    )
    print(f"  first episode ({trajectory.status}, reward {trajectory.reward}):")
    print(describe(trajectory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (seconds)")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per step (one group)")
    parser.add_argument("--summary", action="store_true", help="compaction writes a summary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="a model folder (e.g. a checkpoint of examples/wordle.py)",
    )
    args = parser.parse_args()
    if args.tiny:
        from toolgym.testing import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer)
    else:
        from toolgym.agents.models import load_model, load_tokenizer

        tokenizer, model = load_tokenizer(args.model), load_model(args.model)

    print("Several user turns (ShoppingList, two items: three user turns):")
    rows = shopping_rows(1, args.seed) * args.episodes
    limits = AgentLimits(max_turns=8, max_new_tokens=128, max_episode_tokens=2000)
    one_step(model, tokenizer, ShoppingList, rows, limits=limits, parser="hermes")

    print(f"Compaction (Wordle, compacted past 450 tokens, summary {args.summary}):")
    rows = list(toolgym.spec("Wordle-v0").dataset(1, seed=args.seed)) * args.episodes
    limits = AgentLimits(max_turns=6, max_new_tokens=128, max_episode_tokens=2000)
    one_step(
        model,
        tokenizer,
        "Wordle-v0",
        rows,
        limits=limits,
        parser="hermes",
        compact_at_tokens=450,
        compact_summary=args.summary,
    )


if __name__ == "__main__":
    main()
