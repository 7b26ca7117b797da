"""Wordle's feedback options: `known_letters` (a line of everything the feedback so far says)
and `hints` (the answers that still fit), and the example's rows."""

from __future__ import annotations

import random

import pytest

from toolgym.builtin_envs.wordle import (
    Wordle,
    WordleExpert,
    allowed_words,
    answer_words,
    feedback,
    known_letters,
)
from toolgym.envs.calls import ToolError
from toolgym.envs.tools import instance_tools


def test_known_letters_reads_greens_yellows_and_grays() -> None:
    history = [(w, feedback(w, "crane")) for w in ("stare", "apple", "carry")]
    assert known_letters(history) == (
        "Known so far: C _ A _ E; in the word elsewhere: R (not 3, 4); "
        "not in the word: L, P, S, T, Y."
    )


def test_a_repeated_letter_counts_its_copies() -> None:
    """LLAMA: one L found green, a second L known to be elsewhere; E gray in both guesses."""
    history = [(w, feedback(w, "llama")) for w in ("hello", "label")]
    line = known_letters(history)
    assert line.startswith("Known so far: L _ _ _ _;")
    assert "L (not 3, 4, 5)" in line and "A (not 2)" in line
    assert line.endswith("not in the word: B, E, H, O.")


def _parse(line: str) -> tuple[list[str], dict[str, set[int]], set[str]]:
    body = line.removeprefix("Known so far: ").removesuffix(".")
    parts = body.split("; ")
    spots = parts[0].lower().split(" ")
    elsewhere: dict[str, set[int]] = {}
    absent: set[str] = set()
    for part in parts[1:]:
        if part.startswith("in the word elsewhere: "):
            for item in part.removeprefix("in the word elsewhere: ").split("), "):
                letter, _, positions = item.rstrip(")").partition(" (not ")
                elsewhere[letter.lower()] = {int(p) - 1 for p in positions.split(", ")}
        else:
            absent = {c.lower() for c in part.removeprefix("not in the word: ").split(", ")}
    return spots, elsewhere, absent


def test_the_line_is_true_of_the_answer() -> None:
    """Over random answers and guesses (random words, then the expert's), everything the line
    states holds for the answer: it never misleads."""
    rng, expert = random.Random(0), WordleExpert()
    words = sorted(allowed_words())
    for answer in rng.sample(answer_words(), 40):
        history = [(w, feedback(w, answer)) for w in rng.sample(words, 2)]
        while len(history) < 5 and history[-1][1] != "GGGGG":
            word = expert.next_guess(history)
            history.append((word, feedback(word, answer)))
            spots, elsewhere, absent = _parse(known_letters(history))
            assert all(s in ("_", a) for s, a in zip(spots, answer, strict=True))
            for letter, positions in elsewhere.items():
                assert answer.count(letter) > spots.count(letter)
                assert all(answer[i] != letter for i in positions)
            assert not absent & set(answer)


def test_the_option_is_off_by_default_and_adds_the_line_when_on() -> None:
    plain, helped = Wordle(), Wordle(known_letters=True)
    for env in (plain, helped):
        env.reset(answer="crane")
    assert "Known so far" not in plain.guess("stare")
    text = helped.guess("stare")
    assert (
        text.splitlines()[1] == "Known so far: _ _ A _ E; in the word elsewhere: R (not 4); "
        "not in the word: S, T."
    )
    assert text.endswith("5 guesses left.")
    assert "Known so far" not in helped.guess("crane")  # a win needs no summary


def test_spelled_demonstrations_write_letters_as_the_feedback_does() -> None:
    plain, spelled = Wordle(), Wordle(spelled=True)
    for env in (plain, spelled):
        env.reset(answer="crane")
    words = [turn[0].arguments["word"] for turn in plain.demonstration()]
    letters = [turn[0].arguments["word"] for turn in spelled.demonstration()]
    assert letters == [" ".join(word.upper()) for word in words]
    assert letters[-1] == "C R A N E"
    # the tool reads the spelled form with or without the option, as the same word
    assert plain.guess("S T A R E").startswith("Guess 1/6: S(gray) T(gray) A(green)")
    assert plain.history == [("stare", "--GYG")]
    with pytest.raises(ToolError, match="not in the word list"):
        plain.guess("Q Z X W V")


@pytest.mark.parametrize("levels", [[], ["--levels", "2,4,8,16,0"]], ids=["full", "levels"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_example_never_trains_on_a_held_out_answer(seed: int, levels: list[str]) -> None:
    """examples/wordle.py's rows: warm-up and GRPO answers (and candidate words, with
    --levels) are never evaluation answers; with --levels the warm-up's games alternate the
    levels, so a warm-up the budget shortens still covers each."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "wordle.py"
    spec = importlib.util.spec_from_file_location("wordle_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.build_parser().parse_args(["--seed", str(seed), *levels])
    train, warmup, held_out = example.datasets(args)
    assert len(held_out) == args.eval_games and len(warmup) == args.warmup_games
    trained = {row["answer"] for row in train + warmup}
    trained |= {word for row in train + warmup for word in row.get("candidates", [])}
    assert not trained & {row["answer"] for row in held_out}
    if levels:
        assert [row["difficulty"] for row in warmup[:10]] == [0, 1, 2, 3, 4] * 2
        assert {row["difficulty"] for row in train} == {0, 1, 2, 3, 4}
        assert all("candidates" not in row for row in held_out)  # the full game


def _listed(text: str) -> list[str] | None:
    """The words a feedback text's hint line lists (None: the line gives only a number)."""
    line = text.splitlines()[-2]
    if line.startswith("Words that still fit") or ", among them: " in line:
        return line.split(": ", 1)[1].removesuffix(".").split(", ")
    assert line.endswith("possible answers still fit.")
    return None


@pytest.mark.parametrize("hint_sample", [0, 5])
def test_hints_list_exactly_the_answers_that_still_fit(hint_sample: int) -> None:
    """Over random games (random words, then the expert's), the hint line gives the number of
    answers consistent with every guess so far, and lists them (the answer among them) once
    there are at most `hints`; a brute-force filter of the answer list agrees. While more
    fit, `hint_sample` of them are listed beside the number, spread evenly over them."""
    rng, words = random.Random(1), sorted(allowed_words())
    for answer in rng.sample(answer_words(), 25):
        env = Wordle(hints=12, max_guesses=8, hint_sample=hint_sample)
        expert = WordleExpert()
        env.reset(answer=answer)
        text = env.guess(rng.choice(words))
        while "Correct!" not in text and "Out of guesses" not in text:
            fits = [w for w in answer_words() if all(feedback(g, w) == p for g, p in env.history)]
            listed = _listed(text)
            if len(fits) <= 12:
                assert listed == fits and answer in listed
            else:
                assert text.splitlines()[-2].startswith(f"{len(fits)} possible answers ")
                spread = [fits[i * len(fits) // hint_sample] for i in range(hint_sample)]
                assert listed == (spread or None)
                assert len(set(spread)) == hint_sample
            text = env.guess(expert.next_guess(env.history))


def test_hints_draw_from_the_candidates_and_are_off_by_default() -> None:
    env = Wordle(hints=3)
    env.reset(answer="crane", candidates=["crane", "crate", "stone", "grace"])
    assert env.guess("slate").splitlines()[1] == "Words that still fit (2): crane, grace."
    plain = Wordle()
    plain.reset(answer="crane")
    assert "still fit" not in plain.guess("slate")
    with pytest.raises(ValueError, match="hints must be 0 or more"):
        Wordle(hints=-1)
    for hint_sample in (-1, 4):
        with pytest.raises(ValueError, match=r"hint_sample must be from 0 to hints \(3\)"):
            Wordle(hints=3, hint_sample=hint_sample)


@pytest.mark.parametrize("hint_sample", [0, 8])
def test_with_hints_the_expert_guesses_a_listed_word(hint_sample: int) -> None:
    """The demonstrations a warm-up learns from: once a list is shown (every guess after
    the first with `hint_sample`), the expert's next guess is on it (so copying from the
    list is what they teach), and `hints` adds no tool."""
    env = Wordle(hints=20, hint_sample=hint_sample)
    assert list(instance_tools(env)) == ["guess"]
    for answer in random.Random(2).sample(answer_words(), 20):
        env.reset(answer=answer)
        listed = None
        for turn in env.demonstration():
            word = turn[0].arguments["word"]
            assert listed is None or word in listed
            listed = _listed(env.guess(word)) if word != answer else None
            assert listed is not None or not hint_sample or word == answer


def test_a_refused_word_repeats_the_last_feedbacks_help_lines() -> None:
    """A refused word (not five letters, not in the list) uses no guess, and its error says
    why and then repeats what the last feedback's help lines said (everything known, the words
    that still fit), so the next turn has words to copy; the plain game's refusal is one line."""
    env = Wordle(hints=3, known_letters=True)
    env.reset(answer="crane", candidates=["crane", "crate", "stone", "grace"])
    feedback_lines = env.guess("slate").splitlines()[1:3]
    assert feedback_lines[1] == "Words that still fit (2): crane, grace."
    for word, reason in (("laundry", "is not a five-letter word"), ("qzxwv", "not in the word")):
        with pytest.raises(ToolError) as refused:
            env.guess(word)
        lines = str(refused.value).splitlines()
        assert reason in lines[0] and "did not use a guess" in lines[0]
        assert lines[1:] == feedback_lines
    assert [w for w, _ in env.history] == ["slate"]
    before_any = Wordle(hints=3, hint_sample=2)
    before_any.reset(answer="crane")
    with pytest.raises(ToolError) as refused:
        before_any.guess("grow")  # no guess yet: no known letters, the number and two words
    shown = ", ".join(before_any._listed([])[1])
    assert str(refused.value).splitlines()[1].endswith(f"still fit, among them: {shown}.")
    plain = Wordle()
    plain.reset(answer="crane")
    with pytest.raises(ToolError) as refused:
        plain.guess("grow")
    assert str(refused.value) == "'grow' is not a five-letter word; this did not use a guess."


def test_demo_refusals_show_a_refused_word_the_warm_up_does_not_learn() -> None:
    """With `demo_refusals=1` every expert game of more than one guess shows one refused word
    after its first guess (chosen by the answer: the same each time), then goes on as the
    flawless game does; played through the agent loop for the warm-up, the refused turn's
    tokens are context (loss mask 0) and every other turn is learned."""
    from toolgym.algorithms import demonstrations, episode_factory
    from toolgym.algorithms.turn_credit import turns
    from toolgym.testing import tiny_tokenizer

    answers = random.Random(4).sample(answer_words(), 12)
    for answer in answers:
        flawless = Wordle(hints=20, hint_sample=8)
        shown = Wordle(hints=20, hint_sample=8, demo_refusals=1.0)
        for env in (flawless, shown):
            env.reset(answer=answer)
        plain = [t[0].arguments["word"] for t in flawless.demonstration()]
        words = [t[0].arguments["word"] for t in shown.demonstration()]
        assert words == [t[0].arguments["word"] for t in shown.demonstration()]  # deterministic
        if len(plain) == 1:
            assert words == plain
            continue
        (refused,) = [i for i, w in enumerate(words) if w not in allowed_words()]
        assert refused >= 1 and words[:refused] + words[refused + 1 :] == plain
        with pytest.raises(ToolError, match="did not use a guess"):
            shown.guess(words[refused])
    with pytest.raises(ValueError, match="demo_refusals must be from 0 to 1"):
        Wordle(demo_refusals=1.5)

    prompt = [{"role": "user", "content": "Play Wordle with the guess tool."}]
    rows = [{"prompt": prompt, "answer": a} for a in answers[:4]]
    make = episode_factory(Wordle, {"hints": 20, "hint_sample": 8, "demo_refusals": 1.0})
    tokenizer = tiny_tokenizer()
    for demo in demonstrations(make, rows, tokenizer, parser="hermes"):
        calls = [m for m in demo.messages if m["role"] == "assistant"]
        failed = [m.get("failure") for m in demo.messages if m["role"] == "tool"]
        assert len(calls) == len(failed) and failed.count("tool_error") == 1
        assert demo.reward == 1.0
        spans = turns(demo)  # the runs of learned tokens: every turn but the refused one
        assert len(spans) == len(calls) - 1
        learned = [
            demo.samples[s.sample].completion_ids[s.start : s.end] for s in spans
        ]  # fmt: skip
        refused_word = next(
            c["tool_calls"][0]["function"]["arguments"]["word"]
            for c, f in zip(calls, failed, strict=True)
            if f
        )
        text = [tokenizer.decode(ids) for ids in learned]
        assert not any(refused_word in t for t in text)
        assert sum("guess" in t for t in text) == len(calls) - 1
