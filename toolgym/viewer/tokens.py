"""Token ids to text for the viewer's token view, with the run's own tokenizer.

The tokenizer is found next to the run (`engine-weights/`, else the newest `checkpoint-*/`,
else the folder itself) or given explicitly (a folder, a hub id or `smollm2-135m`, as for
`--model`), and loaded in the background with `toolgym.agents.models.load_tokenizer`
(importing transformers takes seconds). Nothing waits for it: until it is loaded, tokens
come back as ids only with `pending` true in `describe()`, and the page asks again a moment
later. Without one, tokens are shown as their ids and the page says why. Each token carries
its decoded `text` and its raw vocabulary string (`token`, from `convert_ids_to_tokens`),
which shows the bytes of a byte-level piece that decodes to U+FFFD on its own.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def find_tokenizer(run_path: Path) -> Path | None:
    """The folder holding the run's tokenizer, or None. `run_path` is a run folder or a file
    inside one (a trajectories JSONL: its folder is searched)."""
    folder = run_path if run_path.is_dir() else run_path.parent
    checkpoints = sorted(
        (p for p in folder.glob("checkpoint-*") if p.is_dir()),
        key=lambda p: int(m[0]) if (m := re.search(r"\d+", p.name)) else -1,
        reverse=True,
    )
    for candidate in [folder / "engine-weights", *checkpoints, folder]:
        if any((candidate / name).is_file() for name in TOKENIZER_FILES):
            return candidate
    return None


def _finite(value: Any) -> float | None:
    """`value` if it is a finite number, else None (huge integers included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:
        return None


class TokenDecoder:
    """Decodes single token ids, each once (cached), with a tokenizer loaded in a thread;
    never waits for it (see the module docstring).

    Args:
        run_path: Where to look for the tokenizer when `tokenizer` is None.
        tokenizer: A tokenizer folder or hub name given by the user.
    """

    def __init__(self, run_path: Path, tokenizer: str | None = None) -> None:
        self.source = tokenizer or (str(p) if (p := find_tokenizer(run_path)) else None)
        self.error: str | None = None if self.source else "no tokenizer found next to the run"
        self._tokenizer: Any = None
        self._cache: dict[Any, tuple[str | None, str | None]] = {}
        self._loaded = threading.Event()
        if self.source:
            threading.Thread(target=self._load, name="viewer-tokenizer", daemon=True).start()
        else:
            self._loaded.set()

    def _load(self) -> None:
        """Load the tokenizer (in the background thread); a failure is kept in `error`."""
        try:
            from toolgym.agents.models import load_tokenizer  # folder, hub id or smollm2-135m

            self._tokenizer = load_tokenizer(str(self.source))  # started only with a source
        except Exception as error:  # any failure: show ids only, and say why
            self.error = f"could not load the tokenizer from {self.source}: {error}"
        finally:
            self._loaded.set()

    def ready(self, timeout: float | None = 60.0) -> bool:
        """Wait up to `timeout` seconds for the tokenizer to load (0: do not wait); whether
        one is usable."""
        self._loaded.wait(timeout)
        return self._loaded.is_set() and self._tokenizer is not None

    def describe(self) -> dict[str, Any]:
        """What the page shows about the tokenizer."""
        return {
            "source": self.source,
            "loaded": self._tokenizer is not None,
            "pending": not self._loaded.is_set(),
            "error": self.error,
        }

    def decode(self, token_id: int) -> str | None:
        """The text of one token, or None while no tokenizer is loaded (never waits)."""
        return self.lookup(token_id)[0]

    def lookup(self, token_id: Any) -> tuple[str | None, str | None]:
        """`(text, raw token string)` of one id; `(None, None)` while no tokenizer is loaded
        (never waits), or where the tokenizer cannot decode the id."""
        if not self.ready(timeout=0):
            return None, None
        try:
            return self._cache[token_id]
        except KeyError:
            pass
        except TypeError:  # not hashable: not a token id
            return None, None
        try:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            raw = self._tokenizer.convert_ids_to_tokens(token_id)
            found: tuple[str | None, str | None] = (str(text), None if raw is None else str(raw))
        except Exception:  # an id outside the vocabulary, or not an int
            found = (None, None)
        self._cache[token_id] = found
        return found

    def tokens(
        self, ids: list[int], mask: list[int] | None = None, logprobs: list[float] | None = None
    ) -> list[dict[str, Any]]:
        """One dict per token: `id`, `text` and the raw `token` string (None without a
        tokenizer, or while it loads), and for completion tokens `mask` and `logprob` (a finite
        number, or None)."""
        rows = []
        for position, token_id in enumerate(ids):
            text, raw = self.lookup(token_id)
            row: dict[str, Any] = {"id": token_id, "text": text, "token": raw}
            if mask is not None:
                row["mask"] = mask[position] if position < len(mask) else 0
                logprob = logprobs[position] if logprobs and position < len(logprobs) else None
                row["logprob"] = _finite(logprob)
            rows.append(row)
        return rows
