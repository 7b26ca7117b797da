"""The policy's weights as an inference engine loads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def policy_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's parameter names.

    A peft model's LoRA adapters are merged in (each adapted weight becomes W + scale * B @ A)
    and its wrapper names removed, so that vLLM, which knows only the base architecture, loads
    the policy the trainer is sampling from. The merged copy costs the adapted layers' memory
    once; the trainer's model is left unmerged. Other models give their own state dict.
    """
    if not hasattr(model, "merge_adapter"):
        return model.state_dict()
    with torch.no_grad():
        model.merge_adapter()
        try:
            state = {}
            for name, tensor in model.get_base_model().state_dict().items():
                if "lora_" in name or ".original_module." in name:
                    continue
                name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
                state[name] = tensor.detach().clone()
        finally:
            model.unmerge_adapter()
    return state


def save_policy(model: Any, folder: str | Path) -> None:
    """Save the policy (adapters merged, see `policy_state_dict`) as a transformers folder."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.save_pretrained(folder, state_dict=policy_state_dict(model))
