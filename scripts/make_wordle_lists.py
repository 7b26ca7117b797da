"""Regenerate toolgym/builtin_envs/data/wordle_*.txt from Debian's SCOWL word lists.

Usage: apt-get download wamerican-small wamerican-large && dpkg-deb -x <each>.deb ROOT,
then `python scripts/make_wordle_lists.py ROOT/usr/share/dict`.
"""

import re
import sys
from pathlib import Path

ROMAN = re.compile(r"m{0,4}(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})")
OUT = Path(__file__).resolve().parent.parent / "toolgym" / "envs" / "data"
HEADER = """# {what}
# Derived from SCOWL (Spell Checker Oriented Word Lists) by Kevin Atkinson, as packaged in
# Debian's {package}: lower-case five-letter words only{extra}.
# SCOWL licence: Copyright 2000-2011 by Kevin Atkinson. Permission to use, copy, modify,
# distribute and sell these word lists, the associated scripts, the output created from the
# scripts, and its documentation for any purpose is hereby granted without fee, provided that
# the above copyright notice appears in all copies and that both that copyright notice and this
# permission notice appear in supporting documentation. Kevin Atkinson makes no representations
# about the suitability of this array for any purpose. It is provided "as is" without express or
# implied warranty. See toolgym/builtin_envs/data/README.md for the full notice and how to
# regenerate.
"""


def read_words(path: Path, length: int | None = None) -> set[str]:
    lines = path.read_text(encoding="utf-8", errors="ignore").split()
    return {w for w in lines if re.fullmatch(r"[a-z]+", w) and length in (None, len(w))}


def is_inflected(word: str, vocabulary: set[str]) -> bool:
    if word.endswith("s") and not word.endswith("ss") and word[:-1] in vocabulary:
        return True
    if word.endswith("es") and word[:-2] in vocabulary:
        return True
    return word.endswith("ed") and (word[:-2] in vocabulary or word[:-1] in vocabulary)


def main(dict_dir: Path) -> None:
    vocabulary = read_words(dict_dir / "american-english-large")
    common = read_words(dict_dir / "american-english-small", 5)
    answers = sorted(
        w for w in common if not is_inflected(w, vocabulary) and not ROMAN.fullmatch(w)
    )
    large = read_words(dict_dir / "american-english-large", 5)
    allowed = sorted((large | set(answers)) - {w for w in large if ROMAN.fullmatch(w)})
    extra = ", without simple plurals, -ed forms and Roman numerals"
    (OUT / "wordle_answers.txt").write_text(
        HEADER.format(
            what="Wordle answers: common English five-letter words.",
            package="wamerican-small (SCOWL size 35) 2020.12.07-2",
            extra=extra,
        )
        + "\n".join(answers)
        + "\n"
    )
    (OUT / "wordle_allowed.txt").write_text(
        HEADER.format(
            what="Wordle allowed guesses (answers included).",
            package="wamerican-large (SCOWL size 70) 2020.12.07-2",
            extra=", without Roman numerals",
        )
        + "\n".join(allowed)
        + "\n"
    )
    print(f"{len(answers)} answers, {len(allowed)} allowed guesses -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
