"""Wordle with toolgym.

Today this plays held-out Wordle games with the built-in expert (candidate filtering) through
the same tool-call protocol a model uses, and prints one game and the win rate. Training an
LLM with GRPO on this environment arrives with the agents and algorithms rooms.

    python examples/wordle.py                 # 100 held-out games
    python examples/wordle.py --games 20 --seed 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import toolgym
from toolgym.envs.wordle import WordleExpert


def play_games(games: int, seed: int, verbose: bool) -> None:
    spec = toolgym.spec("Wordle-v0")
    rows = spec.dataset(games, seed=seed, split="test")
    expert = WordleExpert()
    rewards, guesses = [], []
    started = time.perf_counter()
    for index, row in enumerate(rows):
        env = toolgym.make("Wordle-v0")
        env.reset(seed=seed + index, **row)
        moves = expert.play(env)
        rewards.append(env.get_reward())
        guesses.append(len(moves))
        if verbose and index == 0:
            print(row["prompt"][0]["content"], "\n")
            for word, answer in moves:
                print(f"guess({word!r}) -> {answer}")
            print()
    elapsed = time.perf_counter() - started
    print(
        f"expert on {games} held-out words: win rate {statistics.mean(rewards):.1%}, "
        f"mean guesses {statistics.mean(guesses):.2f}, {elapsed / games * 1000:.1f} ms per game"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--games", type=int, default=100, help="games to play")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out words drawn")
    parser.add_argument("--quiet", action="store_true", help="do not print the first game")
    args = parser.parse_args()
    play_games(args.games, args.seed, verbose=not args.quiet)


if __name__ == "__main__":
    main()
