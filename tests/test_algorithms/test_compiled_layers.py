"""The policy's decoder layers compiled during the update (`GRPOConfig.compile_model`, the
CUDA default), run here through torch.compile on the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from accelerate import Accelerator
from helpers import float64_norms
from torch._dynamo.exc import TorchDynamoException

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.compiled_layers import (
    compiled_layers,
    decoder_layers,
)
from toolgym.algorithms.learner import Learner
from toolgym.algorithms.losses import compile_by_default
from toolgym.testing import tiny_model, tiny_tokenizer


def test_the_decoder_layers_are_the_models_repeated_blocks():
    model = tiny_model(tiny_tokenizer())
    assert decoder_layers(model) == list(model.model.layers)
    assert compile_by_default(None, torch.device("cpu")) is False
    assert compile_by_default(None, torch.device("cuda")) is True
    assert compile_by_default(True, torch.device("cpu")) is True


def test_the_layers_run_compiled_only_inside_the_block():
    model = tiny_model(tiny_tokenizer())
    keys = list(model.state_dict())
    with compiled_layers(model, enabled=False) as layers:
        assert layers == []
    with compiled_layers(model) as layers:
        assert len(layers) == model.config.num_hidden_layers
        assert all(layer._compiled_call_impl is not None for layer in layers)
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    assert list(model.state_dict()) == keys  # saving and weight sync see the same names


def test_a_model_without_named_layers_warns_once_and_runs_uncompiled():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.warns(UserWarning, match="names no decoder layers"), compiled_layers(model) as got:
        assert got == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with compiled_layers(model) as got:
            assert got == []


def test_a_layer_that_cannot_compile_runs_eager_with_a_warning(monkeypatch):
    """A compilation failure (no compiler, an operation dynamo refuses) is not the end of the
    run: the layer warns once and runs eager, with the same outputs."""
    model = tiny_model(tiny_tokenizer()).eval()
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits

    def failing_compile(function, *args, **kwargs):
        def run(*a, **k):
            raise TorchDynamoException("the backend found no C compiler")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    warned = pytest.warns(UserWarning, match="could not be compiled")
    with compiled_layers(model), warned, torch.no_grad():
        got = model(ids, use_cache=False).logits
    assert torch.equal(got, expected)


def _group(tokenizer) -> list[Trajectory]:
    """Three episodes of one prompt (so the update shares its prefix) with tool results."""
    trajectories = []
    for i, turns in enumerate([(5, 3, 6), (9,), (4, 2, 4, 2, 3)]):
        sample = Sample(list(range(10, 19)))
        for j, n in enumerate(turns):
            ids = [(20 + 7 * i + 3 * j + k) % 100 for k in range(n)]
            sample.append(ids, sampled=j % 2 == 0, logprobs=[-1.5 - 0.1 * k for k in range(n)])
        trajectories.append(Trajectory([sample]))
    return trajectories


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_an_update_with_compiled_layers_takes_the_same_step(checkpointing):
    """`Learner.update` with two passes (old logprobs without gradients), the KL, a shared
    prompt prefix and, in one case, gradient checkpointing: compiled layers give the same
    gradients as eager ones in every pass (float64, the norms too), and the layers run eager
    again afterwards."""
    tokenizer = tiny_tokenizer()
    gradients = {}
    for compile_model in (False, True):
        config = GRPOConfig(
            output_dir="unused",
            compile_model=compile_model,
            gradient_checkpointing=checkpointing,
            num_iterations=2,
            beta=0.1,
            micro_batch_size=3,
            learning_rate=1e-3,
            logprob_chunk_size=5,
            progress_bar=False,
        )
        model = tiny_model(tokenizer, seed=4).double()
        float64_norms(model)
        learner = Learner(model, config, Accelerator(cpu=True), tokenizer.pad_token_id)
        passes, step = [], learner.optimizer.step

        def record_then_step(step=step, passes=passes, learner=learner) -> None:
            passes.append([p.grad.clone() for p in learner.policy.parameters()])
            step()

        learner.optimizer.step = record_then_step
        advantages = torch.tensor([0.8, -0.5, -0.3])
        stats = learner.update(_group(tokenizer), advantages, torch.ones(3, dtype=torch.bool), 3)
        assert stats["kl"] > 0 and len(passes) == 2
        assert all(layer._compiled_call_impl is None for layer in learner.policy.model.layers)
        gradients[compile_model] = passes
    for eager, compiled in zip(gradients[False], gradients[True], strict=True):
        for a, b in zip(eager, compiled, strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-10 * float(a.abs().max()))
