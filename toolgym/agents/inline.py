"""Token-level pieces of inline episodes (`toolgym.envs.inline`): observation ids that decode,
after the model's tokens, to exactly the observation's text."""

from __future__ import annotations

from typing import Any

_CONTEXT = 8  # tokens before the observation that the boundary check decodes with it


def observation_ids(tokenizer: Any, before: list[int], text: str) -> tuple[list[int], bool]:
    """Token ids of `text` to append after `before`, tokenized on their own (the model's
    sampled ids are never re-tokenized), and whether decoding `before + ids` gives
    `decode(before) + text` exactly.

    Byte-level BPE tokenizers pass as they are. Tokenizers that mark a word start
    (SentencePiece's "▁", added to the first word of any text) would add a space at the
    boundary: the text is then encoded after a newline anchor whose ids are dropped."""
    tail = before[-_CONTEXT:]

    def exact(ids: list[int]) -> bool:
        return _decode(tokenizer, tail + ids) == _decode(tokenizer, tail) + text

    ids = tokenizer.encode(text, add_special_tokens=False)
    if exact(ids):
        return ids, True
    anchor = tokenizer.encode("\n", add_special_tokens=False)
    joined = tokenizer.encode("\n" + text, add_special_tokens=False)
    if joined[: len(anchor)] == anchor and exact(joined[len(anchor) :]):
        return joined[len(anchor) :], True
    return ids, False


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)
