"""Wordle, Arithmetic and GuessNumber behave as their rules say."""

from __future__ import annotations

import pytest

import toolgym
from toolgym import ToolCall
from toolgym.builtin_envs.wordle import (
    WordleExpert,
    allowed_words,
    answer_words,
    feedback,
    in_split,
    wordle_dataset,
)


@pytest.mark.parametrize(
    ("guess", "answer", "expected"),
    [
        ("crane", "crane", "GGGGG"),
        ("slate", "crane", "--G-G"),
        ("speed", "abide", "--Y-Y"),  # one E in the answer: only the first E is yellow
        ("eerie", "there", "Y-Y-G"),  # the green E is matched first, then one yellow E
        ("llama", "hello", "YY---"),  # two Ls in both: both yellow
        ("hello", "llama", "--YY-"),
        ("sassy", "asset", "YYG--"),  # the green S uses one S, the first S takes the other
        ("geese", "those", "---GG"),  # the answer's only E is taken by the green: others gray
        ("abbey", "kebab", "YYGY-"),  # the green B takes one B, the first B the other
    ],
)
def test_wordle_feedback_with_repeated_letters(guess, answer, expected):
    assert feedback(guess, answer) == expected


def play(env, *words):
    return [env.step(ToolCall("guess", {"word": w})) for w in words]


def test_invalid_words_do_not_use_a_guess():
    env = toolgym.make("Wordle-v0")
    env.reset(answer="crane")
    for bad in ("cat", "abcde", "12345"):
        (result,) = play(env, bad)
        assert result.info["failures"][0]["kind"] == "tool_error"
        assert "did not use a guess" in result.messages[0]["content"]
    assert env.unwrapped.history == []
    (result,) = play(env, "slate")
    assert result.messages[0]["content"].startswith(
        "Guess 1/6: S(gray) L(gray) A(green) T(gray) E(green)"
    )


def test_win_reward_and_game_over():
    env = toolgym.make("Wordle-v0")
    env.reset(answer="crane")
    *_, last = play(env, "slate", "crane")
    assert (last.reward, last.terminated, env.get_reward()) == (1.0, True, 1.0)
    assert "found CRANE in 2 guesses" in last.messages[0]["content"]
    (after,) = play(env, "crane")
    assert after.info["failures"][0]["kind"] == "episode_over"


def test_wordle_episode_metrics_name_the_skills_behind_the_reward():
    env = toolgym.make("Wordle-v0")
    env.reset(answer="crane")
    assert env.episode_metrics()["valid_guesses"] == 0
    # slate: --G-G; "grace" fits that (and gets -GGYG); "slate" again does not fit; "xyzzy" is
    # not a word (no guess used); "crane" fits both and wins
    play(env, "slate", "grace", "slate", "xyzzy", "crane")
    assert env.episode_metrics() == {
        "valid_guesses": 4.0,
        "distinct_words": 3.0,
        "consistent_guesses": 2.0,  # grace and crane
        "greens_found": 5.0,
        "yellows_found": 1.0,  # the c of "grace"
        "win": 1.0,
    }


def test_six_wrong_guesses_lose():
    env = toolgym.make("Wordle-v0")
    env.reset(answer="crane")
    results = play(env, "slate", "moist", "pudgy", "blimp", "woken", "fuzzy")
    assert results[-1].terminated
    assert env.get_reward() == 0.0
    assert "The word was CRANE" in results[-1].messages[0]["content"]


def word_credit(word: str, answer: str) -> float:
    """A new valid word's share of the partial credit (shaping 0.5, six guesses)."""
    pattern = feedback(word, answer)
    return 0.5 * (1 + pattern.count("G") + pattern.count("Y") / 2) / (6 * 6)


def test_shaping_gives_partial_credit_for_a_loss():
    env = toolgym.make("Wordle-v0", shaping=0.5)
    env.reset(answer="crane")
    words = ("slate", "moist", "pudgy", "blimp", "woken", "fuzzy")
    play(env, *words)
    assert env.get_reward() == pytest.approx(sum(word_credit(w, "crane") for w in words))
    assert 0 < env.get_reward() < 0.5


def test_shaping_credits_an_unfinished_game_for_its_guesses_so_far():
    env = toolgym.make("Wordle-v0", shaping=0.5)
    env.reset(answer="crane")
    play(env, "pudgy")  # no letter in common: a valid new word still earns a little
    assert env.get_reward() == pytest.approx(0.5 / 36)
    play(env, "slate")
    first = word_credit("pudgy", "crane") + word_credit("slate", "crane")
    assert env.get_reward() == pytest.approx(first)
    play(env, "slate", "blah")  # a repeated word and an invalid one earn nothing
    assert env.get_reward() == pytest.approx(first)
    play(env, "trace")  # a new word that reuses the letters found earns more than one without
    assert word_credit("trace", "crane") > word_credit("slate", "crane") > 0.5 / 36
    assert env.get_reward() == pytest.approx(first + word_credit("trace", "crane"))
    assert not env.done


def test_word_lists_are_shipped_and_consistent():
    answers = answer_words()
    assert len(answers) > 2000
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in answers)
    assert set(answers) <= allowed_words()
    assert len(allowed_words()) > len(answers)


def test_train_and_test_splits_are_disjoint():
    train = {r["answer"] for r in wordle_dataset(500, seed=0, split="train")}
    test = {r["answer"] for r in wordle_dataset(100, seed=0, split="test")}
    assert train.isdisjoint(test)
    assert all(in_split(w, "test") for w in test)


def test_expert_wins_almost_always():
    expert = WordleExpert()
    wins = 0
    for seed in range(40):
        env = toolgym.make("Wordle-v0")
        env.reset(seed=seed)
        expert.play(env)
        wins += env.get_reward() == 1.0
    assert wins >= 38


def test_arithmetic_final_answer():
    env = toolgym.make("Arithmetic-v0")
    env.reset(a=4821, b=9384, operation="multiply")
    assert (
        env.step(ToolCall("multiply", {"a": 4821, "b": 9384})).messages[0]["content"] == "45240264"
    )
    env.final_answer("So the answer is 45,240,264")
    assert (env.get_reward(), env.done) == (1.0, True)
    env.reset(a=10, b=3, operation="subtract")
    env.final_answer("I think it is 13")
    assert env.get_reward() == 0.0


def test_arithmetic_divide_by_zero_is_a_tool_error():
    env = toolgym.make("Arithmetic-v0")
    env.reset(seed=0)
    result = env.step(ToolCall("divide", {"a": 1, "b": 0}))
    assert result.messages[0]["content"] == "Error: division by zero"


def test_arithmetic_dataset_rows_are_solvable():
    for row in toolgym.spec("Arithmetic-v0").dataset(20, seed=1):
        env = toolgym.make("Arithmetic-v0")
        env.reset(**row)
        assert str(env.unwrapped.target) and row["prompt"][0]["content"].endswith("plain number.")


def test_guess_number_binary_search_earns_full_reward():
    env = toolgym.make("GuessNumber-v0")
    for target in (1, 37, 100):
        env.reset(target=target)
        low, high = 1, 100
        while not env.done:
            mid = (low + high) // 2
            content = env.step(ToolCall("guess", {"n": mid})).messages[0]["content"]
            if "higher" in content:
                low = mid + 1
            elif "lower" in content:
                high = mid - 1
        assert env.get_reward() == 1.0


def test_guess_number_slow_play_earns_less_and_range_is_checked():
    env = toolgym.make("GuessNumber-v0")
    env.reset(target=9)
    for n in range(1, 10):
        env.step(ToolCall("guess", {"n": n}))
    assert env.get_reward() == pytest.approx(7 / 9)
    env.reset(target=5)
    result = env.step(ToolCall("guess", {"n": 500}))
    assert result.info["failures"][0]["kind"] == "tool_error"


@pytest.mark.parametrize("env_id", ["Wordle-v0", "Arithmetic-v0", "GuessNumber-v0"])
def test_same_seed_and_row_behave_identically(env_id):
    """GRPO groups rely on this: instances reset alike play alike."""

    def trajectory(seed):
        env = toolgym.make(env_id)
        env.reset(seed=seed)
        name = env.tools[0]["function"]["name"]
        args = (
            {"word": "crane"}
            if env_id == "Wordle-v0"
            else {"n": 50}
            if name == "guess"
            else {"a": 2, "b": 3}
        )
        messages = [env.step(ToolCall(name, args)).messages for _ in range(3)]
        state = {k: v for k, v in vars(env.unwrapped).items() if k != "_rng"}
        return messages, state

    first, state = trajectory(11)
    again, state_again = trajectory(11)
    assert first == again
    assert state == state_again
    outcomes = {str(trajectory(seed)[1]) for seed in range(6)}
    assert len(outcomes) > 1, "different seeds should draw different episodes"
