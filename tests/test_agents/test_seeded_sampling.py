"""Seeded sampling (`SamplingParams.seed`): the same seed, prompt and weights sample the same
tokens, whatever else shares the batch; an agent's episodes each draw their own seeds (by
their place in the run and the turn), so a paired evaluation before and after training uses
the same random numbers game by game (common random numbers)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import three_turns, wordle_rows

import toolgym
from toolgym.agents import Agent, AgentLimits, HFEngine, ScriptedEngine
from toolgym.agents.engines.base import GenerationRequest, SamplingParams, completion_seed
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.environments import EveryRow
from toolgym.algorithms.sampler import Sampler
from toolgym.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=11)


def request(tokenizer, text: str, seed: int | None, temperature: float = 1.0):
    prompt = tokenizer.encode(text, add_special_tokens=False)
    return GenerationRequest(prompt, SamplingParams(24, temperature, seed=seed))


def test_completion_seeds_are_stable_distinct_and_fit_every_engine():
    seeds = {completion_seed(7, episode, turn) for episode in range(20) for turn in range(10)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert completion_seed(7, 0, 0) != completion_seed(8, 0, 0)
    assert completion_seed(7, 1, 2) != completion_seed(7, 12)  # not a joined string
    code = (
        "from toolgym.agents.engines.base import completion_seed; print(completion_seed(7, 3, 1))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == completion_seed(7, 3, 1)  # no per-process hash salt


def test_hf_a_seed_samples_the_same_tokens_alone_or_in_a_batch_and_leaves_torch_s_stream(tiny):
    tokenizer, model = tiny
    engine = HFEngine(model, tokenizer)
    alone = engine.generate([request(tokenizer, "Hello there", seed=3)])[0]
    start = torch.get_rng_state()
    unseeded = engine.generate([request(tokenizer, "Something else entirely", seed=None)])[0]
    after_unseeded = torch.get_rng_state()
    torch.set_rng_state(start)
    batched = engine.generate(
        [
            request(tokenizer, "Something else entirely", seed=None),
            request(tokenizer, "Hello there", seed=3),
            request(tokenizer, "Hello", seed=4),
        ]
    )
    assert batched[1].token_ids == alone.token_ids
    assert batched[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    # the unseeded request drew from torch's own stream; the seeded ones left it as it was
    assert batched[0].token_ids == unseeded.token_ids
    assert torch.equal(torch.get_rng_state(), after_unseeded)
    draws = {
        tuple(engine.generate([request(tokenizer, "Hello there", seed)])[0].token_ids)
        for seed in range(4)
    }
    assert len(draws) > 1  # the seed decides: sampling is not secretly greedy


def test_an_agent_seeds_each_completion_by_episode_and_turn_the_same_in_every_run():
    tokenizer = tiny_tokenizer()
    seen: list[int | None] = []

    class Recording(ScriptedEngine):
        def generate(self, requests):
            seen.extend(r.sampling.seed for r in requests)
            return super().generate(requests)

    engine = Recording([tokenizer.encode("no call here", add_special_tokens=False)])

    agent = Agent(engine, tokenizer, limits=AgentLimits(max_turns=3, max_new_tokens=8))
    sampling = SamplingParams(temperature=1.0, seed=21)

    def play() -> list:
        seen.clear()
        envs = [toolgym.make("Wordle-v0") for _ in range(4)]
        agent.run(envs, wordle_rows(4), [0] * 4, rollout_fn=three_turns, sampling=sampling)
        return sorted(seen)

    first = play()
    assert len(first) == 12 and len(set(first)) == 12  # one reset seed, yet each its own
    assert play() == first
    assert set(first) == {completion_seed(21, e, t) for e in range(4) for t in range(3)}
    envs = [toolgym.make("Wordle-v0")]
    agent.run(envs, wordle_rows(1), rollout_fn=three_turns)
    assert seen[-1] is None  # unseeded unless asked


def test_a_seeded_evaluation_replays_its_games_and_another_seed_does_not(tiny):
    tokenizer, model = tiny
    agent = Agent(
        HFEngine(model, tokenizer), tokenizer, limits=AgentLimits(max_turns=2, max_new_tokens=12)
    )
    sampler = Sampler(
        agent, EveryRow(lambda: toolgym.make("Wordle-v0")), wordle_rows(3), GRPOConfig(), []
    )

    def tokens(seed):
        return [t.completion_ids for t in sampler.evaluate(wordle_rows(3), 1.0, seed=seed)]

    first = tokens(5)
    assert tokens(5) == first
    assert tokens(6) != first
    assert len({tuple(ids) for ids in first}) == 3  # three games, three draws


def test_hf_greedy_requests_share_a_batch_whatever_their_seeds(tiny, monkeypatch):
    tokenizer, model = tiny
    engine = HFEngine(model, tokenizer)
    batches = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: batches.append(1) or generate(**kw))
    greedy = [request(tokenizer, "Hello there", seed=s, temperature=0.0) for s in range(3)]
    assert len({tuple(c.token_ids) for c in engine.generate(greedy)}) == 1
    assert len(batches) == 1
    engine.generate([request(tokenizer, "Hello there", seed=s) for s in range(3)])
    assert len(batches) == 4  # seeded sampling: each request alone
