"""Wordle: find a secret five-letter word in six guesses from per-letter colour feedback.

Feedback follows the real game, repeated letters included: a letter is green in the right
spot; otherwise yellow only while the answer still has an unmatched copy of it (greens are
matched first, then yellows from left to right); otherwise gray. The word lists are derived
from SCOWL (see `data/README.md` for the source and licence).
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any, NoReturn

from toolgym.envs.calls import ToolCall, ToolError
from toolgym.envs.core import Environment
from toolgym.envs.stepping import Stepper

GREEN, YELLOW, GRAY = "G", "Y", "-"
COLOUR_NAMES = {GREEN: "green", YELLOW: "yellow", GRAY: "gray"}
WORD_LENGTH = 5

RULES = (
    "Let's play Wordle. Find the secret five-letter English word in at most {guesses} guesses. "
    "Call the `guess` tool with one word at a time. After each guess you get a colour for every "
    "letter: green means the letter is in the word and in that spot, yellow means it is in the "
    "word but in another spot, gray means it is not in the word (a repeated letter is coloured "
    "once per copy in the answer). Use the feedback to choose your next guess."
)


@cache
def answer_words() -> tuple[str, ...]:
    """Possible answers: common English five-letter words (SCOWL size 35, see data/)."""
    return _read_word_list("wordle_answers.txt")


@cache
def allowed_words() -> frozenset[str]:
    """Every word accepted as a guess (SCOWL size 70 five-letter words plus the answers)."""
    return frozenset(_read_word_list("wordle_allowed.txt"))


def _read_word_list(name: str) -> tuple[str, ...]:
    text = (
        resources.files("toolgym.builtin_envs").joinpath("data", name).read_text(encoding="utf-8")
    )
    return tuple(line for line in text.splitlines() if line and not line.startswith("#"))


def feedback(guess: str, answer: str) -> str:
    """The colours of `guess` against `answer`, e.g. `"-YG--"` (G green, Y yellow, - gray)."""
    pattern = [GRAY] * len(guess)
    unmatched: Counter[str] = Counter()
    for i, (g, a) in enumerate(zip(guess, answer, strict=True)):
        if g == a:
            pattern[i] = GREEN
        else:
            unmatched[a] += 1
    for i, g in enumerate(guess):
        if pattern[i] != GREEN and unmatched[g] > 0:
            pattern[i] = YELLOW
            unmatched[g] -= 1
    return "".join(pattern)


def describe(guess: str, pattern: str) -> str:
    """Feedback as text: `C(gray) R(yellow) A(green) N(gray) E(gray)`."""
    return " ".join(f"{g.upper()}({COLOUR_NAMES[p]})" for g, p in zip(guess, pattern, strict=True))


def known_letters(history: Sequence[tuple[str, str]]) -> str:
    """All the feedback so far in one line, e.g. `Known so far: _ R _ _ E; in the word
    elsewhere: A (not 1, 3), T (not 4); not in the word: C, N, S.` (spots count from 1):
    greens by position, letters known to be in the answer but not where tried (yellow, or a
    gray copy beside a coloured one), and letters no guess coloured."""
    spots = ["_"] * WORD_LENGTH
    copies: Counter[str] = Counter()  # copies of a letter known to be in the answer
    not_at: dict[str, set[int]] = {}
    absent: set[str] = set()
    for word, pattern in history:
        coloured = Counter(w for w, p in zip(word, pattern, strict=True) if p != GRAY)
        for i, (letter, colour) in enumerate(zip(word, pattern, strict=True)):
            if colour == GREEN:
                spots[i] = letter
            elif coloured[letter]:  # yellow, or a gray copy of a letter found elsewhere
                not_at.setdefault(letter, set()).add(i)
            else:
                absent.add(letter)
        for letter, count in coloured.items():
            copies[letter] = max(copies[letter], count)
    elsewhere = [
        f"{letter.upper()} (not {', '.join(str(i + 1) for i in sorted(not_at.get(letter, ())))})"
        for letter in sorted(copies)
        if copies[letter] > spots.count(letter)
    ]
    parts = [f"Known so far: {' '.join(c.upper() for c in spots)}"]
    if elsewhere:
        parts.append(f"in the word elsewhere: {', '.join(elsewhere)}")
    if absent:
        parts.append(f"not in the word: {', '.join(sorted(c.upper() for c in absent))}")
    return "; ".join(parts) + "."


class Wordle(Environment):
    """Wordle with a `guess(word)` tool.

    Reward is 1 for a win and 0 otherwise. With `shaping > 0`, a game not won (lost, or cut
    short by a turn or token limit) earns partial credit: `shaping` times the mean, over the
    `max_guesses` guesses a game allows, of each valid guess's (1 + greens + yellows / 2) / 6;
    a guess not made, or a word guessed before, counts 0. Every new valid word adds credit
    (a sixth of a word's best even with no letter in common), and more for letters in the
    word, so a model is rewarded for the skills a win needs before it can win: real words, no
    repeats, letters found. A game cut short keeps only what it earned.

    With `guess_reward > 0`, each guess also earns a reward of its own, in the turn that made
    it (a chat episode's step reward: `GRPOConfig.step_rewards="tokens"` credits it to that
    turn's tokens): `+guess_reward` for a guess after the first that is consistent with all
    the feedback so far (it could still be the answer: the colours were used, as
    `consistent_guesses` counts), `-guess_reward` for a word guessed before or a word the tool
    refuses (not five letters, not in the word list); 0 for the first guess and for a new
    word the feedback rules out. A game not won ends with its partial credit plus these; a
    won game's reward stays 1 (the win's turn gets what makes it up to 1), and a game not won
    always stays below 1 (`shaping + (max_guesses - 1) * guess_reward < 1` is required).
    With `guess_floor`, the penalties only take back what the game's guesses earned: the sum
    of its per-guess rewards never falls below 0, so guessing never scores below not guessing.

    Args:
        max_guesses: Valid guesses allowed per game.
        shaping: Weight of the partial credit for a game not won (0 turns it off).
        max_turns: Turns (messages with tool calls) before truncation; invalid words use turns,
            not guesses, so this bounds a model that keeps sending bad words.
        guess_reward: The per-guess reward and penalty (0, the default, turns it off).
        guess_floor: Keep the game's sum of per-guess rewards at 0 or more.
        known_letters: Add to each guess's feedback a line with everything known so far
            (`known_letters()`: greens by position, letters elsewhere and where they are not,
            letters ruled out), so the colours of earlier turns need not be re-read. Off by
            default: the plain game.
        spelled: The expert's demonstrations write each guess letter by letter in capitals,
            as the feedback writes letters (`"T R A C E"`), so a model whose tokens are
            whole words can copy the known letters spot by spot. The tool reads a word
            spelled so with or without this option.
        hints: When at most this many possible answers (of the candidates, or of
            `answer_words()` in the full game) still fit all the feedback, each guess's
            feedback lists them ("Words that still fit (3): ..."); while more fit it gives
            their number. The help a solver's word list gives a human player: the colours
            still decide which words are listed, and choosing among them is the model's
            job. 0 (the default): the plain game.
        hint_sample: With `hints`, while more than `hints` answers fit, the feedback also
            lists this many of them, spread evenly over their alphabetical order ("173
            possible answers still fit, among them: ..."), so every guess after the first
            has words to copy that use all the colours. The expert's demonstrations then
            play the listed word that splits the answers still fitting best. 0 (the
            default): only the number. A refused word's error repeats the known-letters
            and hint lines of the last feedback (when they are on).
        demo_refusals: The share of the expert's demonstrations (chosen by the answer) that
            show one refused word (a word of four or six letters, or five letters not in the
            list, made from another answer) before one of the guesses after the first, the
            expert's guess following it. The warm-up does not learn the refused turn
            (`toolgym.algorithms.sft` clears a refused call's loss mask), only what follows a
            refusal: models warmed up on flawless games sent the same refused word again
            until the turn limit. 0 (the default): flawless games.

    A row may carry `candidates`, a list of words that holds the answer: the game then starts
    by naming them ("The secret word is one of these 4 words: ..."), the expert's
    demonstrations guess only among them, and the game is easier the shorter the list
    (`wordle_levels` builds rows of rising difficulty for `GRPOConfig.curriculum`).
    """

    def __init__(
        self,
        max_guesses: int = 6,
        shaping: float = 0.0,
        max_turns: int = 12,
        guess_reward: float = 0.0,
        known_letters: bool = False,
        guess_floor: bool = False,
        spelled: bool = False,
        hints: int = 0,
        hint_sample: int = 0,
        demo_refusals: float = 0.0,
    ) -> None:
        if not 0.0 <= shaping < 1.0:
            raise ValueError(f"shaping must be in [0, 1), got {shaping}")
        if guess_reward < 0.0 or shaping + (max_guesses - 1) * guess_reward >= 1.0:
            raise ValueError(
                f"guess_reward must be at least 0 and keep a game not won below a win "
                f"(shaping + (max_guesses - 1) * guess_reward < 1), got {guess_reward}"
            )
        self.max_guesses = max_guesses
        self.shaping = shaping
        self.max_turns = max_turns
        self.guess_reward = guess_reward
        self.guess_floor = guess_floor
        self.known_letters = known_letters
        self.spelled = spelled
        if hints < 0:
            raise ValueError(f"hints must be 0 or more, got {hints}")
        self.hints = hints
        if not 0 <= hint_sample <= hints:
            raise ValueError(f"hint_sample must be from 0 to hints ({hints}), got {hint_sample}")
        self.hint_sample = hint_sample
        if not 0.0 <= demo_refusals <= 1.0:
            raise ValueError(f"demo_refusals must be from 0 to 1, got {demo_refusals}")
        self.demo_refusals = demo_refusals
        self.answer = ""
        self.candidates: tuple[str, ...] = ()
        """The words the game said the answer is among (none: the full game)."""
        self.history: list[tuple[str, str]] = []
        self.guess_credit = 0.0
        """The sum of this game's per-guess rewards and penalties so far."""

    def reset(
        self, answer: str | None = None, candidates: Sequence[str] | None = None
    ) -> str | None:
        if answer is None:
            answer = self.rng.choice(list(candidates) if candidates else answer_words())
        answer = answer.strip().lower()
        if len(answer) != WORD_LENGTH or not answer.isalpha():
            raise ValueError(f"a Wordle answer is five letters, got {answer!r}")
        words = tuple(dict.fromkeys(w.strip().lower() for w in candidates or ()))
        if words and answer not in words:
            raise ValueError(f"the candidates {list(words)} do not hold the answer {answer!r}")
        self.answer, self.candidates = answer, words
        self.history = []
        self.guess_credit = 0.0
        if not words:
            return None
        return f"The secret word is one of these {len(words)} words: {', '.join(words)}."

    def guess(self, word: str) -> str:
        """Guess the secret word and get a colour for each letter.

        Args:
            word: A five-letter English word (its letters may be separated by spaces).
        """
        word = "".join(word.split()).lower()
        if len(word) != WORD_LENGTH or not word.isalpha():
            self._refuse(f"{word!r} is not a five-letter word; this did not use a guess.")
        if word not in allowed_words() and word != self.answer:
            self._refuse(f"{word!r} is not in the word list; this did not use a guess.")
        self._add_guess_credit(self._judge(word))
        pattern = feedback(word, self.answer)
        self.history.append((word, pattern))
        used = len(self.history)
        line = f"Guess {used}/{self.max_guesses}: {describe(word, pattern)}"
        if pattern == GREEN * WORD_LENGTH:
            self.done, self.reward = True, 1.0
            return f"{line}\nCorrect! You found {word.upper()} in {used} guesses."
        self.reward = self._partial_credit() + self.guess_credit
        line = "\n".join([line, *self._help_lines()])
        if used >= self.max_guesses:
            self.done = True
            return f"{line}\nOut of guesses. The word was {self.answer.upper()}."
        return f"{line}\n{self.max_guesses - used} guesses left."

    def episode_metrics(self) -> dict[str, float]:
        """The skills behind the reward: `valid_guesses` (real words played, repeats
        included), `distinct_words`, `consistent_guesses` (guesses after the first that could
        still be the answer given all the feedback before them: the colours were used),
        `greens_found` (positions of the answer revealed green), `yellows_found` (distinct
        letters revealed yellow) and `win` (1 or 0)."""
        words = [word for word, _ in self.history]
        consistent = sum(
            all(feedback(earlier, word) == pattern for earlier, pattern in self.history[:index])
            for index, word in enumerate(words)
            if index > 0
        )
        greens = {i for _, p in self.history for i, colour in enumerate(p) if colour == GREEN}
        yellows = {w[i] for w, p in self.history for i, colour in enumerate(p) if colour == YELLOW}
        won = bool(self.history) and self.history[-1][1] == GREEN * WORD_LENGTH
        return {
            "valid_guesses": len(words),
            "distinct_words": len(set(words)),
            "consistent_guesses": consistent,
            "greens_found": len(greens),
            "yellows_found": len(yellows),
            "win": float(won),
        }

    def demonstration(self) -> list[list[ToolCall]]:
        """The expert's guesses for this episode's answer, one tool call per turn."""
        expert = WordleExpert(self.candidates) if self.candidates else _expert()
        history, words = list(self.history), []
        while len(history) < self.max_guesses:
            shown = self._listed(history)[1] if history and self.hint_sample else None
            word = expert.next_guess(history, among=shown)
            words.append(word)
            history.append((word, feedback(word, self.answer)))
            if word == self.answer:
                break
        choice = random.Random(zlib.crc32(f"{self.answer}:{len(self.history)}".encode()))
        if len(words) > 1 and choice.random() < self.demo_refusals:
            at = choice.randrange(1, len(words))
            words.insert(at, _refused_word(choice))
        spell = self.spelled
        return [[ToolCall("guess", {"word": " ".join(w.upper()) if spell else w})] for w in words]

    def _refuse(self, reason: str) -> NoReturn:
        """Refuse a word (its penalty, with `guess_reward`): the error says why and then
        repeats the help lines of the last feedback (`known_letters`, `hints`), so the turn
        after a refusal has the state, and words to copy, as close as after a guess. (Without
        them, a model that sent a bad word sent the same one again in nearly every game:
        docs/training.md, "A refused word ends the game".)"""
        self._credit(-self.guess_reward)
        raise ToolError("\n".join([reason, *self._help_lines()]))

    def _help_lines(self) -> list[str]:
        """The lines a feedback adds after the colours: everything known so far (with
        `known_letters`, once a guess was made) and the words that still fit (with `hints`)."""
        lines = [known_letters(self.history)] if self.known_letters and self.history else []
        return lines + ([self._hint()] if self.hints else [])

    def _hint(self) -> str:
        """`hints`' line: the possible answers (the game's candidates, or `answer_words()`)
        that fit every guess's colours so far when there are few enough, else their number
        (and, with `hint_sample`, an even spread of them)."""
        fitting, shown = self._listed(self.history)
        if len(fitting) <= self.hints:
            return f"Words that still fit ({len(fitting)}): {', '.join(shown)}."
        if shown:
            return f"{len(fitting)} possible answers still fit, among them: {', '.join(shown)}."
        return f"{len(fitting)} possible answers still fit."

    def _listed(self, history: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
        """The possible answers that fit `history`, and those the hint line shows: all of
        them up to `hints`, else `hint_sample` spread evenly over them (maybe none)."""
        fitting = remaining_answers(self.candidates or answer_words(), history)
        if len(fitting) <= self.hints:
            return fitting, fitting
        count = self.hint_sample
        return fitting, [fitting[i * len(fitting) // count] for i in range(count)]

    def _judge(self, word: str) -> float:
        """A valid guess's own reward: + for one after the first that fits all the feedback
        so far, - for a repeated word, else 0."""
        if any(word == earlier for earlier, _ in self.history):
            return -self.guess_reward
        if self.history and all(feedback(e, word) == p for e, p in self.history):
            return self.guess_reward
        return 0.0

    def _credit(self, amount: float) -> None:
        """Add a per-guess reward to the game's reward now (a refused word's penalty)."""
        if amount:
            self._add_guess_credit(amount)
            self.reward = self._partial_credit() + self.guess_credit

    def _add_guess_credit(self, amount: float) -> None:
        """Add to the game's sum of per-guess rewards (held at 0 or more with `guess_floor`)."""
        self.guess_credit += amount
        if self.guess_floor:
            self.guess_credit = max(self.guess_credit, 0.0)

    def _partial_credit(self) -> float:
        if self.shaping == 0.0 or not self.history:
            return 0.0
        distinct = dict(self.history)  # one entry per word: a word guessed again earns nothing
        credit = sum(1 + p.count(GREEN) + p.count(YELLOW) / 2 for p in distinct.values())
        return self.shaping * credit / ((WORD_LENGTH + 1) * self.max_guesses)


def _refused_word(choice: random.Random) -> str:
    """A word the tool refuses, made from a random answer: its first four letters, it and one
    more letter, or its letters shuffled into a five-letter string that is not in the list."""
    word = choice.choice(answer_words())
    kind = choice.randrange(3)
    if kind == 0:
        return word[:4]
    if kind == 1:
        return word + choice.choice("abcdefghijklmnopqrstuvwxyz")
    letters = list(word)
    for _ in range(20):
        choice.shuffle(letters)
        if "".join(letters) not in allowed_words():
            return "".join(letters)
    return word[:4]


class WordleExpert:
    """A strong Wordle player by candidate filtering, used for demonstrations and baselines.

    It keeps the answers consistent with all feedback so far and guesses the one that splits
    the remaining candidates best (highest entropy of feedback patterns); while many candidates
    remain it uses letter frequencies, which is fast and nearly as good.
    """

    def __init__(self, answers: Sequence[str] | None = None, entropy_below: int = 150) -> None:
        self.answers = tuple(answers if answers is not None else answer_words())
        self.entropy_below = entropy_below
        self.opening = self._by_letter_frequency(self.answers)

    def candidates(self, history: Iterable[tuple[str, str]]) -> list[str]:
        """Answers consistent with every (guess, pattern) pair seen so far."""
        return remaining_answers(self.answers, history)

    def next_guess(
        self, history: Sequence[tuple[str, str]], among: Sequence[str] | None = None
    ) -> str:
        """The expert's next word given the (guess, feedback) pairs so far; with `among`
        (possible answers, e.g. those a hint line shows), the one of them that splits all
        the possible answers best."""
        if not history:
            return self.opening
        remaining = self.candidates(history)
        if not remaining:
            raise ValueError("no answer is consistent with the feedback; was it misreported?")
        if among and len(among) < len(remaining):
            return max(among, key=lambda w: _split_entropy(w, remaining))
        if len(remaining) <= 2:
            return remaining[0]
        if len(remaining) < self.entropy_below:
            return max(remaining, key=lambda w: _split_entropy(w, remaining))
        return self._by_letter_frequency(remaining)

    def play(self, env: Stepper) -> list[tuple[str, str]]:
        """Play the current episode of `env` (a stepped Wordle, as `toolgym.make` returns) to
        its end; returns (guess, feedback text) pairs."""
        moves = []
        while not env.done and not env.truncated:
            word = self.next_guess(env.unwrapped.history)
            result = env.step({"name": "guess", "arguments": {"word": word}})
            moves.append((word, result.messages[0]["content"]))
        return moves

    @staticmethod
    def _by_letter_frequency(words: Sequence[str]) -> str:
        letters = Counter(c for w in words for c in set(w))
        positions = Counter((i, c) for w in words for i, c in enumerate(w))
        return max(
            words,
            key=lambda w: sum(letters[c] for c in set(w)) + sum(positions[p] for p in enumerate(w)),
        )


@cache
def _expert() -> WordleExpert:
    return WordleExpert()


def _split_entropy(guess: str, candidates: Sequence[str]) -> float:
    counts = Counter(feedback(guess, answer) for answer in candidates)
    total = len(candidates)
    entropy = -sum(n / total * math.log2(n / total) for n in counts.values())
    return entropy + (0.01 if counts.get(GREEN * WORD_LENGTH) else 0.0)  # prefer a possible win


def in_split(word: str, split: str) -> bool:
    """A stable train/test split of the answers: about 10% of words are held out for tests."""
    held_out = zlib.crc32(word.encode()) % 10 == 0
    if split == "all":
        return True
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train', 'test' or 'all', not {split!r}")
    return held_out == (split == "test")


def wordle_dataset(
    n: int, seed: int = 0, split: str = "train", guesses: int = 6, candidates: int = 0
) -> list[dict[str, Any]]:
    """`n` Wordle prompts with their answers; `split="test"` draws from held-out words. With
    `candidates` > 0, each row also lists that many words of the split, its answer among
    them in a random place (`Wordle`'s easier game)."""
    words = [w for w in answer_words() if in_split(w, split)]
    if not 0 <= candidates <= len(words):
        raise ValueError(f"candidates must be in [0, {len(words)}], got {candidates}")
    rng = random.Random(seed)
    chosen = rng.sample(words, n) if n <= len(words) else rng.choices(words, k=n)
    prompt = [{"role": "user", "content": RULES.format(guesses=guesses)}]
    rows: list[dict[str, Any]] = [{"prompt": prompt, "answer": word} for word in chosen]
    for row in rows if candidates else ():
        others = rng.sample([w for w in words if w != row["answer"]], candidates - 1)
        others.insert(rng.randrange(candidates), row["answer"])
        row["candidates"] = others
    return rows


def remaining_answers(answers: Iterable[str], history: Iterable[tuple[str, str]]) -> list[str]:
    """The words of `answers` consistent with every (guess, pattern) pair of `history`."""
    remaining = list(answers)
    for guess, pattern in history:
        remaining = [w for w in remaining if feedback(guess, w) == pattern]
    return remaining


LEVELS = (2, 4, 8, 16, 0)
"""`wordle_levels`' default candidate-list sizes, easiest first; 0: the full game."""


def wordle_levels(
    n: int, seed: int = 0, split: str = "train", sizes: Sequence[int] = LEVELS
) -> list[dict[str, Any]]:
    """Rows for a difficulty curriculum (`GRPOConfig.curriculum`): `n` rows at each level,
    `difficulty` 0, 1, ... in the order of `sizes` (the candidate-list size of each level;
    0: the full game, no list)."""
    rows = []
    for level, size in enumerate(sizes):
        for row in wordle_dataset(n, seed + 7919 * level, split, candidates=size):
            rows.append(row | {"difficulty": level})
    return rows
