"""The policy sharded over the processes with FSDP2 (torch's `fully_shard`).

A run launched with FSDP (`accelerate launch` with `distributed_type: FSDP` and
`fsdp_version: 2`, e.g. the shipped `multi-node-fsdp2` config) trains one copy of the policy
split over the processes: each holds a slice of every parameter, of its gradient and of the
optimizer's state, and gathers a decoder layer's full weights only while that layer runs.
toolgym shards the policy itself (`shard_policy`) instead of through `accelerator.prepare`:
accelerate (1.15) shards only on GPUs, and on the CPU would run plain data parallelism; torch's
`fully_shard` runs on both (gloo or NCCL).

Everything that needs the full weights is a collective that every process joins:
`full_weights` (weight syncs, the KL reference after a warm-up, checkpoints) and
`full_optimizer_state` (checkpoints); `load_full_weights` and `load_full_optimizer_state` put
a checkpoint's full tensors back into the slices. Forward and backward passes gather and
reduce per layer, so every process must run the same number of them (the learner pads a
process's micro-batches to the most any process has; see `Learner.update`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from toolgym.algorithms.compiled_layers import decoder_layers


class ShardingError(ValueError):
    """A launch asks for sharding toolgym does not do (FSDP1, parameter offload, LoRA)."""


def fsdp_requested() -> bool:
    """Whether `accelerate launch` started this process with FSDP (a config's
    `distributed_type: FSDP`, or `--use_fsdp`)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_fsdp_launch() -> None:
    """Stop a process launched with FSDP settings toolgym does not honour, with the reason
    (before anything is loaded): FSDP1, parameter offload, accelerate's activation
    checkpointing."""
    if not fsdp_requested():
        return
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise ShardingError(
            f"this process was launched with FSDP version {version}; toolgym shards with "
            "FSDP2 only: set `fsdp_version: 2` (the shipped `multi-node-fsdp2` config) or "
            "launch with --fsdp_version 2"
        )
    refused = {
        "FSDP_OFFLOAD_PARAMS": "parameter offload (fsdp_offload_params) is not supported",
        "FSDP_ACTIVATION_CHECKPOINTING": "use toolgym's --gradient-checkpointing instead of "
        "fsdp_activation_checkpointing",
    }
    for variable, why in refused.items():
        if os.environ.get(variable, "false").lower() == "true":
            raise ShardingError(f"this process was launched with FSDP and {why}")
    unsupported = {  # accelerate's variable: (the value toolgym does, what it is)
        "FSDP_SHARDING_STRATEGY": ({"FULL_SHARD", "1"}, "fsdp_sharding_strategy"),
        "FSDP_STATE_DICT_TYPE": ({"FULL_STATE_DICT"}, "fsdp_state_dict_type"),
        "ACCELERATE_MIXED_PRECISION": ({"no"}, "mixed_precision (use toolgym's --bf16)"),
    }
    for variable, (done, what) in unsupported.items():
        value = os.environ.get(variable)
        if value is not None and value not in done:
            raise ShardingError(
                f"this process was launched with FSDP and {what} {value!r}; toolgym shards "
                f"with {sorted(done)[-1]!r} only"
            )


def check_fsdp_config(config: Any) -> None:
    """Refuse training settings FSDP2 does not take here: LoRA adapters."""
    if getattr(config, "lora", None) is not None:
        raise ShardingError("LoRA adapters are not trained under FSDP; launch with DDP")


def same_weights_everywhere(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` on `device` with the main process's weights and buffers in every process (a
    collective). Sharding assumes equal full weights everywhere; a launch with accelerate's
    `fsdp_cpu_ram_efficient_loading` (on by default with `--use_fsdp`) loads real weights in
    the main process only and zeros in the others."""
    model.to(device)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)
    return model


def shard_policy(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard `model` in place over every process of the default group: one FSDP2 unit per
    decoder layer (`compiled_layers.decoder_layers`), resharded after its forward unless the
    launch says otherwise (`fsdp_reshard_after_forward`), and one for the rest (embeddings,
    final norm, output head). The model must hold its full weights, equal in every
    process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    check_fsdp_launch()  # the settings `toolgym train` checks at start, for library use too
    layers = decoder_layers(model)
    if not layers:
        raise ShardingError(
            f"{type(model).__name__} names no decoder layers in `_no_split_modules`, so "
            "FSDP2 has no units to shard it into; launch with DDP"
        )
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"
    model.to(device)
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    # The root unit (embeddings, final norm, output head) stays gathered after a forward: the
    # loss calls the output head on the captured hidden states after the model's forward.
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def is_sharded(model: Any) -> bool:
    """Whether `model` was sharded by `fully_shard`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_weights(model: nn.Module, main_only: bool = False) -> dict[str, torch.Tensor]:
    """The full weights of a sharded `model` under the model's own parameter names, on its
    device in every process, or with `main_only` in the main process's CPU memory (empty in
    the others). A collective: every process must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=main_only)
    state = get_model_state_dict(model, options=options)
    return {name: tensor for name, tensor in state.items() if isinstance(tensor, torch.Tensor)}


def without_aliases(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the names of tied parameters' second uses (an output head tied to the
    embeddings), as `save_pretrained` writes a model's own weights."""
    own = {name for name, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {name: tensor for name, tensor in state.items() if name in own}


def load_full_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> tuple[list, list]:
    """Load full tensors (a checkpoint's, in every process) into a sharded `model`'s slices,
    as `load_state_dict(strict=False)` does; returns the missing and unexpected names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False)
    missing, unexpected = set_model_state_dict(model, dict(state), options=options)
    return list(missing), list(unexpected)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state, keyed by parameter name, in the main process (empty in the
    others; a collective: every process must call it)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    if not optimizer.state:  # before the first step (torch would take a step at lr 0 here)
        return optimizer.state_dict()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_full_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load `full_optimizer_state`'s result (in every process) into a sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    saved = state.get("state", {})
    if any(isinstance(key, int) for key in saved):
        raise ValueError(
            "this checkpoint's optimizer state was saved by a run without FSDP (keyed by "
            "parameter number); resume it without FSDP"
        )
    if not saved:  # saved before the first step: nothing to load (torch would step at lr 0)
        optimizer.load_state_dict(state)
        return
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)
