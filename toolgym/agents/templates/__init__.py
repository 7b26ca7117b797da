"""Chat templates shipped with toolgym."""

from importlib import resources


def chatml_tools_template() -> str:
    """toolgym's tool-capable ChatML template (Hermes-style `<tool_call>` JSON blocks)."""
    return resources.files(__name__).joinpath("chatml_tools.jinja").read_text(encoding="utf-8")
