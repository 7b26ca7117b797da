"""Wordle's easier games: a row's candidate list names the words the answer is among, and
`wordle_levels` builds rows of rising difficulty for the curriculum."""

from __future__ import annotations

import pytest

import toolgym
from toolgym.algorithms.curriculum import Curriculum
from toolgym.builtin_envs.wordle import (
    LEVELS,
    Wordle,
    answer_words,
    feedback,
    in_split,
    wordle_dataset,
    wordle_levels,
)
from toolgym.testing import tiny_tokenizer


def test_a_candidate_list_is_named_at_the_start_and_must_hold_the_answer():
    env = Wordle()
    text = env.reset(answer="crane", candidates=["light", "Crane", "moist", "crane"])
    assert text == "The secret word is one of these 3 words: light, crane, moist."
    assert env.candidates == ("light", "crane", "moist")
    assert env.reset(answer="crane") is None and env.candidates == ()  # the full game
    with pytest.raises(ValueError, match="do not hold the answer"):
        env.reset(answer="crane", candidates=["light", "moist"])
    env.reset(candidates=["light", "moist"])  # no answer: one of the list
    assert env.answer in ("light", "moist")


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_the_expert_guesses_only_among_the_candidates_and_wins(size):
    rows = wordle_dataset(20, seed=size, candidates=size)
    for row in rows:
        env = Wordle()
        env.reset(answer=row["answer"], candidates=row["candidates"])
        words = [turn[0].arguments["word"] for turn in env.demonstration()]
        assert words[-1] == row["answer"] and len(words) <= env.max_guesses
        assert set(words) <= set(row["candidates"])
        for index, word in enumerate(words[1:], start=1):  # each fits all feedback before it
            history = [(w, feedback(w, row["answer"])) for w in words[:index]]
            assert all(feedback(w, word) == p for w, p in history)


def test_dataset_rows_list_distinct_words_of_their_split_around_the_answer():
    rows = wordle_dataset(50, seed=3, split="test", candidates=8)
    assert rows == wordle_dataset(50, seed=3, split="test", candidates=8)  # by the seed
    positions = set()
    for row in rows:
        words = row["candidates"]
        assert len(words) == len(set(words)) == 8 and row["answer"] in words
        assert all(in_split(w, "test") and w in answer_words() for w in words)
        positions.add(words.index(row["answer"]))
    assert len(positions) > 4  # the answer is not always in one place
    assert all("candidates" not in row for row in wordle_dataset(5))
    with pytest.raises(ValueError, match="candidates must be"):
        wordle_dataset(5, candidates=10**6)


def test_levels_rise_in_difficulty_and_the_curriculum_reads_them():
    rows = wordle_levels(10, seed=1)
    assert [row["difficulty"] for row in rows] == [d for d in range(len(LEVELS)) for _ in range(10)]
    for row in rows:
        size = LEVELS[row["difficulty"]]
        assert len(row.get("candidates", [])) == size
    curriculum = Curriculum(rows, window=3, promote_at=0.6, demote_at=0.1, seed=0)
    assert curriculum.levels == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(row["difficulty"] == 0 for row in curriculum.draw(4))


def test_a_row_with_candidates_plays_through_the_registry_and_the_demonstrations():
    from toolgym.algorithms import demonstrations, episode_factory

    row = wordle_dataset(1, seed=5, candidates=4)[0]
    env = toolgym.make("Wordle-v0")
    first = env.reset(seed=0, **{k: v for k, v in row.items() if k != "prompt"})
    assert "one of these 4 words" in str(first)
    tokenizer = tiny_tokenizer()
    (demo,) = demonstrations(episode_factory("Wordle-v0"), [row], tokenizer, parser="hermes")
    assert demo.reward == 1.0 and "one of these 4 words" in demo.messages[0]["content"]
