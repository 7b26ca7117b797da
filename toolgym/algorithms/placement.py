"""Where the policy's weights live across the training processes, and what follows from it.

Two placements, chosen once per run (`placement_for`):

- `Replicated`: every process holds the whole model (one process, or DDP through accelerate,
  which averages the gradients). The engine samples from the policy itself.
- `Sharded`: the parameters are split over the processes (FSDP2, `toolgym.algorithms.sharding`,
  with `TOOLGYM_FSDP=1` and several processes). Full weights exist only when gathered (a
  collective): for the engine (an in-process engine starts from a full replica), the KL term's
  reference and checkpoints.

The `Learner` asks its placement, never which placement it has.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator

from toolgym.algorithms.config import GRPOConfig
from toolgym.algorithms.sharding import (
    check_fsdp_config,
    fsdp_requested,
    full_optimizer_state,
    full_weights,
    same_weights_everywhere,
    shard_policy,
    without_aliases,
)


class Placement(abc.ABC):
    """How one run places the policy's weights over its processes."""

    sharded: bool
    """Whether the parameters are split over the processes."""

    def __init__(self, accelerator: Accelerator, args: GRPOConfig) -> None:
        """A placement for the processes of `accelerator` and the run's `args`."""
        self.accelerator, self.args = accelerator, args

    def before_adapters(self, model: Any) -> Any:
        """The model as every process must start from, before LoRA and checkpointing."""
        return model

    @abc.abstractmethod
    def place(
        self, model: Any, optimizer_for: Callable[[Any], Any], schedule_for: Callable[[Any], Any]
    ) -> tuple[Any, Any, Any]:
        """(the placed model, its optimizer, the optimizer's learning-rate schedule):
        `optimizer_for(model)` builds the optimizer over a model's parameters and
        `schedule_for(optimizer)` its schedule."""

    @abc.abstractmethod
    def policy(self, model: Any) -> Any:
        """The placed model without wrapping (what is saved; sharded under FSDP)."""

    @abc.abstractmethod
    def engine_policy(self, model: Any) -> Any:
        """The model an in-process engine samples from (None where it needs none)."""

    @abc.abstractmethod
    def engine_weights(self, model: Any) -> tuple[Any, dict[str, torch.Tensor] | None]:
        """What a weight sync hands the engine: (the model it samples from, the full weights
        or None to take them from that model)."""

    @abc.abstractmethod
    def reference(self, model: Any, reference: Any) -> Any:
        """The KL term's reference made equal to the current policy."""

    @abc.abstractmethod
    def clip_gradients(self, model: Any, limit: float) -> float:
        """Clip the gradients' total norm to `limit`; returns the norm before."""

    def checkpoint_state(
        self, model: Any, optimizer: Any
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
        """(full weights, full optimizer state) to save, or None for either to read them
        from the policy and optimizer themselves."""
        return None, None


class Replicated(Placement):
    """Every process holds the whole model (one process, or DDP through accelerate)."""

    sharded = False

    def place(
        self, model: Any, optimizer_for: Callable[[Any], Any], schedule_for: Callable[[Any], Any]
    ) -> tuple[Any, Any, Any]:
        optimizer = optimizer_for(model)
        schedule = schedule_for(optimizer)  # on the optimizer itself, not accelerate's wrapper
        placed, prepared = self.accelerator.prepare(model, optimizer)
        return placed, prepared, schedule

    def policy(self, model: Any) -> Any:
        return self.accelerator.unwrap_model(model)

    def engine_policy(self, model: Any) -> Any:
        return self.policy(model)

    def engine_weights(self, model: Any) -> tuple[Any, dict[str, torch.Tensor] | None]:
        return self.policy(model), None

    def reference(self, model: Any, reference: Any) -> Any:
        return frozen_copy(self.policy(model))

    def clip_gradients(self, model: Any, limit: float) -> float:
        return float(self.accelerator.clip_grad_norm_(model.parameters(), limit))


class Sharded(Placement):
    """The parameters split over the processes (FSDP2); full weights only when gathered."""

    sharded = True

    def __init__(self, accelerator: Accelerator, args: GRPOConfig) -> None:
        """Sharding for `args`, checked first (`sharding.check_fsdp_config`)."""
        super().__init__(accelerator, args)
        check_fsdp_config(args)
        self.replica: Any = None
        """The full copy an in-process engine starts from (and the transformers engine
        samples from, refreshed by `engine_weights`); None for servers and once vLLM holds
        its own copy."""

    def before_adapters(self, model: Any) -> Any:
        return same_weights_everywhere(model, self.accelerator.device)

    def place(
        self, model: Any, optimizer_for: Callable[[Any], Any], schedule_for: Callable[[Any], Any]
    ) -> tuple[Any, Any, Any]:
        if self.args.engine != "vllm-server":
            self.replica = frozen_copy(model)
        placed = shard_policy(model, self.accelerator.device)
        # accelerate would not shard on the CPU (see `sharding`): the model is placed here
        optimizer = optimizer_for(placed)
        return placed, optimizer, schedule_for(optimizer)

    def policy(self, model: Any) -> Any:
        return model

    def engine_policy(self, model: Any) -> Any:
        return self.replica

    def engine_weights(self, model: Any) -> tuple[Any, dict[str, torch.Tensor] | None]:
        """A collective: the full weights are gathered in every process and the replica is
        refreshed with them."""
        if self.args.engine == "vllm":
            self.replica = None  # vLLM holds its own copy: it was only needed to start it
        # servers get the weights from the main process alone (NCCL sends from the device)
        main_only = self.args.engine == "vllm-server" and self.args.weight_sync != "nccl"
        state = full_weights(model, main_only=main_only)
        if self.replica is not None:
            self.replica.load_state_dict(state)
        return self.replica, state

    def reference(self, model: Any, reference: Any) -> Any:
        reference.load_state_dict(full_weights(model))  # a collective
        return reference

    def clip_gradients(self, model: Any, limit: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), limit)  # one per process
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def checkpoint_state(
        self, model: Any, optimizer: Any
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
        """Collectives: every process gathers, the main one writes."""
        weights = without_aliases(model, full_weights(model, main_only=True))
        return weights, full_optimizer_state(model, optimizer)


def placement_for(accelerator: Accelerator, args: GRPOConfig) -> Placement:
    """Sharded where FSDP is asked for (`TOOLGYM_FSDP=1`) over several processes, else
    replicated."""
    if fsdp_requested() and accelerator.num_processes > 1:
        return Sharded(accelerator, args)
    return Replicated(accelerator, args)


def frozen_copy(model: Any) -> Any:
    """A copy of `model` that takes no gradients (the KL term's reference, an engine's
    replica)."""
    return copy.deepcopy(model).requires_grad_(False).eval()
