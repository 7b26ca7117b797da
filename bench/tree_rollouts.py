"""What tree rollouts do to a group's rewards and advantages (issue 46 item 3), against
independent groups with the same episode budget, measured in one run on the same model.

`--env wordle`: Wordle rows (the flagship's settings: 6 turns, 40 new tokens, and its game:
`--env-kwargs`, by default `examples/wordle.py`'s shaping and hint lines). `--env repl`: the
REPL example's problems and limits (`PythonLines-v0`, the inline protocol: a turn is a line;
10 lines of 32 tokens; `--sandbox`, default process). Played `--groups` groups of
`--generations` episodes each, twice: independent episodes (each from the start), and trees
that branch after `--at-turn` turns (the root's first turns once, each member from a fork).
Printed per arm: the mean within-group standard deviation of rewards, the share of groups
with any signal (rewards not all equal), the mean |advantage| (GRPO, scaled by the group's
std), the model tokens generated and the wall time; then the ratios tree / independent.

    python bench/tree_rollouts.py --model runs/wordle/checkpoint-12   # a trained player
    python bench/tree_rollouts.py --env repl --model runs/repl/checkpoint-9
    python bench/tree_rollouts.py --tiny                               # mechanics, seconds
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import Any

import toolgym
from toolgym.agents import Agent, AgentLimits, HFEngine, SamplingParams
from toolgym.algorithms.advantages import group_advantages
from toolgym.algorithms.tree_rollouts import play_trees

FLAGSHIP_GAME = {"shaping": 0.5, "known_letters": True, "hints": 20, "hint_sample": 8}
"""`examples/wordle.py`'s game (its defaults), which its checkpoints were trained on."""


def play(
    agent: Agent, rows: list[dict[str, Any]], group: int, at_turn: int, make: Any
) -> dict[str, float]:
    """One arm: the groups' rewards and their figures (`at_turn` 0: independent episodes)."""
    envs = [make() for _ in rows]
    seeds = [index // group for index in range(len(rows))]
    started = time.perf_counter()
    played: list[Any] = envs
    try:
        if at_turn:
            trajectories, played = play_trees(agent, envs, rows, seeds, group, at_turn)
        else:
            trajectories = agent.run(envs, rows, seeds)
    finally:
        for env in {id(e): e for e in [*envs, *played]}.values():  # forks, and the originals
            env.close()
    seconds = time.perf_counter() - started
    rewards = [t.reward or 0.0 for t in trajectories]
    groups = [rewards[i : i + group] for i in range(0, len(rewards), group)]
    advantages, _ = group_advantages(rewards, [True] * len(rewards), group, scale="group")
    return {
        "reward std in a group": statistics.fmean(statistics.pstdev(g) for g in groups),
        "groups with signal": sum(len(set(g)) > 1 for g in groups) / len(groups),
        "mean |advantage|": float(advantages.abs().mean()),
        "model tokens": float(sum(t.model_tokens for t in trajectories)),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--at-turn", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", choices=["wordle", "repl"], default="wordle")
    parser.add_argument(
        "--env-kwargs", type=json.loads, default=FLAGSHIP_GAME, help="Wordle's arguments (JSON)"
    )
    parser.add_argument("--sandbox", default="process", help="where REPL sessions run")
    args = parser.parse_args()
    if args.tiny:
        from toolgym.testing import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer)
    else:
        from toolgym.agents.models import load_model, load_tokenizer

        tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    if args.env == "wordle":
        limits = AgentLimits(max_turns=6, max_new_tokens=40, max_episode_tokens=1200)
        dataset = toolgym.spec("Wordle-v0").dataset(args.groups, seed=args.seed)
        make = functools.partial(toolgym.make, "Wordle-v0", **args.env_kwargs)
    else:  # examples/repl.py's limits and its held-out problems' generator
        from toolgym.builtin_envs.python_lines import python_lines_dataset

        limits = AgentLimits(max_turns=10, max_new_tokens=32, max_episode_tokens=320)
        dataset = python_lines_dataset(args.groups, seed=10_000 + args.seed)
        make = functools.partial(toolgym.make, "PythonLines-v0", sandbox=args.sandbox)
    agent = Agent(
        HFEngine(model, tokenizer),
        tokenizer,
        parser="hermes",
        limits=limits,
        sampling=SamplingParams(temperature=1.0),
    )
    rows = [dict(row) for row in dataset for _ in range(args.generations)]
    figures = {}
    for name, at_turn in (("independent", 0), (f"tree at turn {args.at_turn}", args.at_turn)):
        figures[name] = play(agent, rows, args.generations, at_turn, make)
        shown = ", ".join(f"{k} {v:.3f}" for k, v in figures[name].items())
        print(f"{name:18} {shown}")
    base, tree = figures.values()
    ratios = ", ".join(f"{k} {tree[k] / base[k]:.2f}x" for k in base if base[k])
    print(f"tree / independent: {ratios}")


if __name__ == "__main__":
    main()
