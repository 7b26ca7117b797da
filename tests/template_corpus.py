"""Real chat templates from two independent public packages, and tokenizers to render them.

`tests/templates/llama.cpp/` holds the templates llama.cpp keeps for its chat tests (from the
llama-cpp-python 0.3.36 sdist on PyPI, MIT licence); `tests/templates/trl/` holds the original
(non-training) templates in the trl 1.16.0 wheel (Apache-2.0). `scripts/collect_templates.sh`
takes them from those packages again. The real tokenizers are not here (no hub): a template's
tokenizer is the tiny offline one with the template's special-looking markers added as special
tokens, which is what a real tokenizer has.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from toolgym.testing import tiny_tokenizer

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATES = sorted(TEMPLATE_DIR.glob("*/*.jinja"))

# Markers that real tokenizers of these families hold as special tokens.
_SPECIAL = re.compile(
    r"<\|[^|<>\s'\"]{1,40}\|>|<\|[\w\"]{1,30}>|<[\w\"]{1,30}\|>|<｜[^<>｜]{1,40}｜>"
    r"|\[[A-Z_]{3,30}\]|<(?:start|end)_of_turn>|<seed:[a-z_]+>|<end_of_sentence>|<SPECIAL_\d+>"
    r"|\[e~\[|\]~b\]|<sep>|</?assistant>"
)


def template_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@functools.cache
def template_tokenizer(path: Path) -> Any:
    """The tiny tokenizer with `path`'s template and its special markers."""
    return tokenizer_for(path.read_text())


def tokenizer_for(template: str) -> Any:
    """The tiny tokenizer with `template` and its special markers."""
    tokenizer = tiny_tokenizer()
    markers = sorted(set(_SPECIAL.findall(template)))
    tokenizer.add_special_tokens(
        {"bos_token": "<s>", "eos_token": "</s>", "additional_special_tokens": markers}
    )
    tokenizer.chat_template = template
    return tokenizer
