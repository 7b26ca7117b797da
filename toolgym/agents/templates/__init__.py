"""Chat templates shipped with toolgym: a ChatML tool template for models whose own template
has no tools, and training templates for popular families whose own template is not
prefix-preserving (`training_template_for`)."""

from __future__ import annotations

from importlib import resources
from typing import Any

# A family's own template is recognised by text only it contains; its training template writes
# the same conversation, changed only where the original rewrites earlier turns.
_TRAINING_TEMPLATES = {
    "qwen3": (
        "qwen3_training.jinja",
        (
            "ns.last_query_index",
            "reasoning_content.strip('\\n') + '\\n</think>\\n\\n'",
            '<tool_call>\\n{"name": "',
        ),
    ),
}


def chatml_tools_template() -> str:
    """toolgym's tool-capable ChatML template (Hermes-style `<tool_call>` JSON blocks)."""
    return _read("chatml_tools.jinja")


def with_tool_template(tokenizer: Any) -> Any:
    """Give a ChatML tokenizer whose template ignores `tools` toolgym's tool template."""
    from toolgym.agents.parsers.detect import renders_tools

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


def training_template_for(template: str | None) -> tuple[str, str] | None:
    """`(family, training template)` when `template` is a family toolgym has a training
    template for (Qwen3), else None."""
    if not template:
        return None
    for family, (file, markers) in _TRAINING_TEMPLATES.items():
        if all(marker in template for marker in markers):
            return family, _read(file)
    return None


def _read(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
