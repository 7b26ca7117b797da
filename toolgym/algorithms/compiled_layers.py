"""The policy's decoder layers through `torch.compile` while the update runs.

transformers runs a decoder layer as a string of small kernels (norms, rotary embedding,
activation, residual adds), each reading and writing activations of the whole batch; compiled,
they fuse, and fewer intermediate activations are kept for the backward pass. Measured on one
H100 (Qwen2.5-0.5B's shape, bf16, 8 x (256 + 4,096) tokens): the update step took 0.30 s
instead of 0.42 s, with 35.6 instead of 48.8 GiB at its peak (docs/training.md).

Each layer is compiled the way `nn.Module.compile` does it (its call routed through a compiled
function, parameters and state dict untouched), but only inside `compiled_layers(...)`: the
compiled call is installed on entry and removed on exit, so generation with the same model
(the transformers engine) and everything outside the update run the layers as written. The
compiled functions are kept per layer, so only the first update (and a new shape class)
pays the compilation. A call with a key-value cache (the shared passes of prefix sharing)
runs eager.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._dynamo.exc import TorchDynamoException

_KEPT = "_toolgym_compiled_call"
"""The attribute that keeps a layer's compiled call between updates, with the layer's id."""
_WARNED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""Models already warned about having no layers to compile."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers model: modules whose class a `PreTrainedModel`
    in `model` names in `_no_split_modules` (its decoder layers), outermost first."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    # (by any class in its hierarchy: FSDP2 renames a sharded layer's class FSDP<name>)
    layers = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    # a layer nested in another named one (a vision tower's blocks, say) is compiled with it
    inner = {id(sub) for layer in layers for sub in layer.modules() if sub is not layer}
    return [layer for layer in layers if id(layer) not in inner]


@contextlib.contextmanager
def compiled_layers(model: nn.Module, enabled: bool = True) -> Iterator[list[nn.Module]]:
    """Within the block, `model`'s decoder layers run compiled; yields the layers compiled
    (none where `enabled` is false, or where a layer already runs compiled)."""
    found = decoder_layers(model) if enabled else []
    if enabled and not found and model not in _WARNED:
        _WARNED.add(model)
        warnings.warn(
            f"compile_model: {type(model).__name__} names no decoder layers in "
            "`_no_split_modules`; the update runs it uncompiled",
            stacklevel=3,
        )
    layers = [m for m in found if m._compiled_call_impl is None]
    for layer in layers:
        owner, call = getattr(layer, _KEPT, (None, None))
        if owner != id(layer):  # none yet, or a deep copy's (of another layer)
            owner, call = id(layer), _without_cache_compiled(layer)
            object.__setattr__(layer, _KEPT, (owner, call))  # it goes when the layer goes
        layer._compiled_call_impl = call
    try:
        yield layers
    finally:
        for layer in layers:
            layer._compiled_call_impl = None


def _without_cache_compiled(layer: nn.Module) -> Any:
    """The layer's call, compiled for calls without a key-value cache. A call with one (the
    shared passes of `toolgym.algorithms.prefix_sharing`) runs eager: the cache is indexed by
    the layer's number, so each layer would compile a graph of its own, and past
    `torch._dynamo.config.recompile_limit` the rest would run eager anyway."""
    compiled: Any = torch.compile(layer._call_impl)

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None or kwargs.get("past_key_values") is not None:
            return layer._call_impl(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except TorchDynamoException as error:  # no compiler, an unsupported operation, ...
            warnings.warn(
                f"compile_model: {type(layer).__name__} could not be compiled, it runs eager "
                f"from now on ({type(error).__name__}: {str(error).splitlines()[0][:300]})",
                stacklevel=2,
            )
            compiled = None
            return layer._call_impl(*args, **kwargs)

    return call
