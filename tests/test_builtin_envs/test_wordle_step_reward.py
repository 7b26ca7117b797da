"""Wordle's per-guess reward (issue 31 item 1): + for a guess that fits all the feedback so
far, - for a repeated or refused word, in the turn that made it; off by default. Feedback
and rewards worked out by hand for the answer "crane"."""

from __future__ import annotations

import pytest
from helpers import GUESS, ids

import toolgym
from toolgym import ToolCall
from toolgym.agents import Agent, ScriptedEngine
from toolgym.builtin_envs.wordle import allowed_words, feedback
from toolgym.testing import tiny_tokenizer

# slate -> --G-G (A and E placed; S, L, T out)
# grace -> -GGYG; fits slate's feedback: feedback("slate", "grace") is --G-G as well
# craze -> GGG-G; fits both: feedback("slate", "craze") = --G-G, feedback("grace", "craze") = -GGYG
# trace: its T is ruled out by slate (feedback("slate", "trace") = --GYG, not --G-G)
HAND = {
    ("slate", "crane"): "--G-G",
    ("grace", "crane"): "-GGYG",
    ("craze", "crane"): "GGG-G",
    ("slate", "grace"): "--G-G",
    ("slate", "craze"): "--G-G",
    ("grace", "craze"): "-GGYG",
    ("slate", "trace"): "--GYG",
}


def test_the_hand_worked_feedback_is_the_games():
    assert {pair: feedback(*pair) for pair in HAND} == HAND
    assert {"slate", "grace", "craze", "trace", "pudgy", "woken"} <= allowed_words()
    assert "xyzzy" not in allowed_words()


def step_rewards(env, *words: str) -> list[float]:
    return [env.step(ToolCall("guess", {"word": w})).reward for w in words]


def test_consistent_guesses_earn_and_repeats_and_refused_words_cost_until_the_win():
    env = toolgym.make("Wordle-v0", guess_reward=0.1)
    env.reset(answer="crane")
    words = ("slate", "grace", "slate", "xyzzy", "cat", "trace", "crane")
    rewards = step_rewards(env, *words)
    # slate: first guess, nothing to fit (0); grace fits (+0.1); slate again (-0.1); xyzzy not
    # in the list (-0.1); cat not five letters (-0.1); trace ruled out (0); crane wins: the
    # reward becomes 1, so that turn gets 1 - (0.1 - 0.3) = 1.2
    assert rewards == pytest.approx([0.0, 0.1, -0.1, -0.1, -0.1, 0.0, 1.2])
    assert env.get_reward() == 1.0 and env.done
    assert env.unwrapped.guess_credit == pytest.approx(-0.1)  # crane fits too: +0.1, in the 1


def test_with_the_floor_penalties_only_take_back_what_guesses_earned():
    env = toolgym.make("Wordle-v0", guess_reward=0.1, guess_floor=True)
    env.reset(answer="crane")
    words = ("slate", "slate", "grace", "xyzzy", "slate", "cat", "trace")
    rewards = step_rewards(env, *words)
    # slate (0); slate again: nothing earned yet, no penalty; grace fits (+0.1); xyzzy takes
    # it back (-0.1); slate again and cat: nothing left to take (0); trace ruled out (0)
    assert rewards == pytest.approx([0.0, 0.0, 0.1, -0.1, 0.0, 0.0, 0.0])
    assert env.unwrapped.guess_credit == 0.0 and env.get_reward() == 0.0


def test_a_lost_game_keeps_its_partial_credit_plus_its_guess_rewards():
    env = toolgym.make("Wordle-v0", shaping=0.5, guess_reward=0.05)
    env.reset(answer="crane")

    def credit(word: str) -> float:  # a new valid word's partial credit (shaping 0.5, 6 guesses)
        pattern = HAND.get((word, "crane")) or feedback(word, "crane")
        return 0.5 * (1 + pattern.count("G") + pattern.count("Y") / 2) / 36

    words = ("slate", "grace", "craze", "craze", "pudgy", "woken")
    rewards = step_rewards(env, *words)
    expected = [
        credit("slate"),
        credit("grace") + 0.05,  # fits slate
        credit("craze") + 0.05,  # fits slate and grace
        -0.05,  # craze again: no new credit, a penalty
        credit("pudgy"),  # a new word the feedback rules out
        credit("woken"),
    ]
    assert rewards == pytest.approx(expected)
    assert env.done and not env.episode_metrics()["win"]
    assert env.get_reward() == pytest.approx(sum(expected)) and env.get_reward() < 1


def test_the_per_guess_reward_is_off_by_default():
    env = toolgym.make("Wordle-v0")
    env.reset(answer="crane")
    assert step_rewards(env, "slate", "grace", "slate", "xyzzy", "crane") == [0, 0, 0, 0, 1.0]


@pytest.mark.parametrize(("shaping", "guess_reward"), [(0.0, -0.1), (0.5, 0.1), (0.0, 0.2)])
def test_a_game_not_won_must_stay_below_a_win(shaping, guess_reward):
    with pytest.raises(ValueError, match="keep a game not won below a win"):
        toolgym.make("Wordle-v0", shaping=shaping, guess_reward=guess_reward)


def test_a_chat_episode_keeps_each_guess_reward_with_its_turn():
    tokenizer = tiny_tokenizer()
    replies = [ids(tokenizer, GUESS.format(word=w)) for w in ("slate", "grace", "crane")]
    agent = Agent(ScriptedEngine(replies), tokenizer, parser="hermes")
    env = toolgym.make("Wordle-v0", guess_reward=0.1)
    (trajectory,) = agent.run([env], [{"prompt": "Play.", "answer": "crane"}])
    assert trajectory.status == "env_done" and trajectory.reward == 1.0
    completion = trajectory.completion_ids
    grace, crane = trajectory.step_rewards  # slate earned 0: not recorded
    assert completion[grace["start"] : grace["end"]] == replies[1]
    assert completion[crane["start"] : crane["end"]] == replies[2]
    assert (grace["reward"], crane["reward"]) == pytest.approx((0.1, 0.9))
