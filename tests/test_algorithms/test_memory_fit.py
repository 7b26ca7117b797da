"""The defaults fit the machine (issue 42 item 6): a run that would not fit stops before it
starts, saying what to change; the allocator and KV-cache defaults are chosen from the machine.
Peak memory itself is measured by `bench/default_memory.py`, never asserted here."""

from __future__ import annotations

import os

import pytest

from toolgym.agents import AgentLimits
from toolgym.agents.engines.vllm import default_kv_cache_tokens
from toolgym.algorithms import GRPOConfig, GRPOTrainer
from toolgym.algorithms.memory_fit import available_memory, check_fit, estimate
from toolgym.runtime.heap import threshold_for_training
from toolgym.testing import tiny_model, tiny_tokenizer


def test_a_run_that_cannot_fit_stops_before_its_engine_starts(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    huge = GRPOConfig(
        output_dir=str(tmp_path),
        engine="vllm",  # refused before vLLM is imported or its weights written
        gradient_checkpointing=False,
        limits=AgentLimits(max_episode_tokens=200_000_000),  # episodes no machine holds
        progress_bar=False,
    )
    rows = [{"prompt": "Guess."}] * 4
    with pytest.raises(MemoryError) as refused:
        GRPOTrainer(model, "GuessNumber-v0", rows, args=huge, tokenizer=tokenizer)
    message = str(refused.value)
    assert "update activations" in message and "micro_batch_size" in message
    assert "memory_check=False" in message and "GB available" in message
    assert not (tmp_path / "engine-weights").exists()  # refused before vLLM's weights were saved
    fits = GRPOConfig(output_dir=str(tmp_path), progress_bar=False)
    assert check_fit(fits, model, "cpu") is not None  # the defaults fit, and say so
    assert check_fit(huge, model, "cuda") is None  # only the CPU is estimated


def test_the_estimate_follows_the_settings_that_shrink_the_update():
    model = tiny_model(tiny_tokenizer(), hidden_size=64, layers=4)
    old = GRPOConfig(gradient_checkpointing=False, mmap_threshold=0)
    new = GRPOConfig()
    parts = {
        k: estimate(c, model).parts["update activations"] for k, c in (("old", old), ("new", new))
    }
    assert parts["new"] < parts["old"]  # checkpointing keeps one input per layer
    smaller = GRPOConfig(micro_batch_size=4)
    assert estimate(smaller, model).parts["update activations"] * 2 == pytest.approx(
        parts["new"], rel=0.01
    )  # the update's memory grows with the tokens of a micro-batch
    for parameter in model.parameters():  # as LoRA leaves it: only adapters train
        parameter.requires_grad_(parameter.ndim == 1)
    assert estimate(new, model).parts["optimizer state"] < parts["new"]
    assert "engine KV cache" in estimate(GRPOConfig(engine="vllm"), model).parts
    hf = estimate(GRPOConfig(engine="hf"), model)  # its caches and the update take turns
    assert hf.total < sum(hf.parts.values()) and hf.to_come == hf.total - hf.parts["policy"]
    overlapping = estimate(GRPOConfig(engine="hf", max_staleness=1), model)
    assert overlapping.total == sum(overlapping.parts.values())
    assert estimate(GRPOConfig(beta=0.1), model).parts["reference model"] > 0
    assert available_memory() is None or available_memory() > 0


def test_the_allocator_threshold_is_set_for_cpu_training_only():
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    assert threshold_for_training(0, "cpu") is False  # 0: glibc's own moving threshold
    assert threshold_for_training(None, "cuda") is False
    assert threshold_for_training(None, "cpu") is bool(glibc)
    with pytest.raises(ValueError, match="mmap_threshold"):
        threshold_for_training(-1, "cpu")


def test_the_kv_cache_default_is_bounded_by_the_machine():
    one = 2048 + 256
    assert default_kv_cache_tokens(2, 2048, per_token=1024) == 2 * one  # small: all of it
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    capped = default_kv_cache_tokens(10**6, 2048, per_token=46_080)
    assert capped == physical // 16 // 46_080 < 10**6 * one  # a sixteenth of the machine
    assert default_kv_cache_tokens(10, 2048, per_token=physical) == one  # never below one
