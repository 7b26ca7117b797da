"""Chat templates shipped with toolgym: a ChatML tool template for models whose own template
has no tools, and training templates for popular families whose own template is not
prefix-preserving (`training_template_for`)."""

from __future__ import annotations

from importlib import resources

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
