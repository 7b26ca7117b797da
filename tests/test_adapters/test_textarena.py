"""TextArena's games as episodes (issue 47 item 4): the games from PyPI's `textarena`, played
unchanged. Each answer is the move (or the `move` tool's argument), the user's next message is
what the game said, and the reward is the game's own. Every check compares with the same moves
played on TextArena directly; a game that would download data is refused before it reaches
the network."""

from __future__ import annotations

import re

import pytest
import textarena
from helpers import ids

import toolgym
from toolgym.adapters.textarena import (
    MissingGameData,
    TextArenaGame,
    game_ids,
    observation_text,
    textarena_dataset,
)
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.testing import tiny_tokenizer


def direct(game: str, seed: int, moves: list[str], opponent=None) -> tuple[dict, list[str]]:
    """The moves played on TextArena itself (its `-raw` game): its rewards, and what it told
    player 0 after each of them."""
    arena = textarena.make(f"{game}-raw")
    arena.reset(num_players=2 if opponent else 1, seed=seed)
    arena.get_observation()  # the rules: the episode's first message
    told = []
    for move in moves:
        done, _ = arena.step(move)
        while not done and opponent and arena.state.current_player_id != 0:
            player, observation = arena.get_observation()
            done, _ = arena.step(opponent(observation_text(observation, player)))
        if done:
            return arena.close()[0], told
        told.append(observation_text(arena.get_observation()[1], 0))
    return {}, told


def next_guess(told: list[str], low: int = 1, high: int = 20) -> int:
    """Binary search over Guess The Number's "higher" / "lower" replies so far."""
    guesses = [int(g) for g in re.findall(r"guess \[(\d+)\]", "\n".join(told))]
    replies = [t for t in told if "target number is" in t]
    for guess, reply in zip(guesses, replies, strict=False):  # the last guess: no reply yet
        low, high = (guess + 1, high) if "higher" in reply else (low, guess - 1)
    return (low + high) // 2


def play(env: toolgym.Stepper, seed: int) -> tuple[list[str], list[str], float]:
    """Binary search through toolgym's stepping layer: the moves, the replies, the reward."""
    told = [env.reset(game_seed=seed)]
    moves = []
    while True:
        moves.append(f"I guess [{next_guess(told + moves)}]")
        reply = env.user_turn(moves[-1])
        if reply is None:
            env.final_answer(moves[-1])
            return moves, told[1:], env.get_reward()
        told.append(reply)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_game_plays_through_toolgym_as_textarena_plays_it(seed):
    moves, told, reward = play(toolgym.make("textarena/GuessTheNumber-v0"), seed)
    rewards, direct_told = direct("GuessTheNumber-v0", seed, moves)
    assert reward == rewards[0] == 1.0  # binary search finds 1..20 in 5 guesses, within 10
    assert told == direct_told and all("The target number is" in t for t in told)


def test_an_invalid_move_ends_the_game_with_textarena_s_own_reward():
    env = toolgym.make("textarena/GuessTheNumber-v0")
    env.reset(game_seed=3)
    moves = ["[4]", "no number in brackets", "still none", "none again"]
    for move in moves:
        if env.user_turn(move) is None:
            break
    played = moves[: int(env.episode_metrics()["game_turns"]) + 1]
    rewards, _ = direct("GuessTheNumber-v0", 3, played)
    assert env.done and env.episode_metrics()["invalid_move"] == 1.0
    assert env.get_reward() == rewards[0]


def test_the_agent_s_loop_plays_answers_as_moves():
    """A scripted policy reads the game's replies from its prompt and answers the next guess;
    the episode ends when the game does, with the game's reward and its messages as user
    turns."""
    tokenizer = tiny_tokenizer()

    def policy(prompt_ids: list[int]) -> list[int]:
        told = tokenizer.decode(prompt_ids).split("<|im_start|>user")[1:]
        return ids(tokenizer, f"I guess [{next_guess(told)}]<|im_end|>")

    engine = ScriptedEngine(policy, context_length=1 << 16)
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=12))
    rows = textarena_dataset(3, split="test")
    envs = [toolgym.make("textarena/GuessTheNumber-v0") for _ in rows]
    trajectories = agent.run(envs, rows)
    for row, trajectory in zip(rows, trajectories, strict=True):
        answers = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
        rewards, told = direct("GuessTheNumber-v0", row["game_seed"], answers)
        assert trajectory.reward == rewards[0] == 1.0, trajectory.error
        users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
        assert users[1:] == told


def test_with_a_tool_the_move_is_the_tool_s_argument():
    env = toolgym.make("textarena/GuessTheNumber-v0", as_tool=True)
    assert [t["function"]["name"] for t in env.tools] == ["move"]
    env.reset(game_seed=0)
    told: list[str] = []
    while not env.done:
        guess = next_guess([f"guess [{g}]\n{t}" for g, t in told])
        result = env.step(toolgym.ToolCall("move", {"action": f"[{guess}]"}))
        told.append((guess, result.messages[0]["content"]))
    assert env.get_reward() == 1.0 and "The game is over" in told[-1][1]


def test_a_game_for_two_plays_the_other_side_with_the_opponent():
    def first_free(observation: str) -> str:
        return re.findall(r"'(\[\d\])'", observation.split("Available Moves:")[-1])[0]

    with pytest.raises(ValueError, match="opponent"):
        TextArenaGame("TicTacToe-v0", num_players=2)
    with pytest.raises(ValueError, match="number of players"):
        toolgym.make("textarena/TicTacToe-v0").reset(game_seed=0)
    env = toolgym.make("textarena/TicTacToe-v0", num_players=2, opponent=first_free)
    env.reset(game_seed=0)
    moves = ["[4]", "[1]", "[7]", "[3]"]
    for move in moves:
        if env.user_turn(move) is None:
            break
    rewards, _ = direct("TicTacToe-v0", 0, moves, opponent=first_free)
    assert env.done and env.get_reward() == rewards[0]
    assert env.get_reward() == 1.0  # 4, 1 against 0, 2: then 7 completes 1-4-7


def test_a_game_that_would_download_data_is_refused_offline():
    """TextArena's Wordle calls `nltk.download` when its module is imported: toolgym refuses
    it by name (what to install) and leaves NLTK's downloader as it was."""
    import nltk

    original = nltk.download
    env = toolgym.make("textarena/Wordle-v0")
    try:
        nltk.data.find("taggers/averaged_perceptron_tagger_eng")
        nltk.data.find("corpora/words")
    except LookupError:
        with pytest.raises(MissingGameData, match=r"nltk\.downloader"):
            env.reset(game_seed=0)
    else:
        pytest.fail("this machine has NLTK's data: the refusal cannot be seen here")
    assert nltk.download is original


def test_the_games_are_registered_with_disjoint_splits():
    listed = toolgym.list_envs("textarena")
    assert "textarena/GuessTheNumber-v0" in listed and len(listed) == len(game_ids()) > 100
    assert not any(i.endswith(("-raw", "-train")) for i in listed)
    spec = toolgym.spec("textarena/GuessTheNumber-v0")
    train, test = spec.dataset(50), spec.dataset(50, split="test")
    assert not {r["game_seed"] for r in train} & {r["game_seed"] for r in test}
    assert all(r["prompt"] == [] for r in train)
    with pytest.raises(ValueError, match="no game"):
        TextArenaGame("NoSuchGame-v0").reset(game_seed=0)
