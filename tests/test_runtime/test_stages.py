"""What a run reports about itself: stage times and memory peaks, the warm-up cache's entries,
the KV-cache size, the smoothed training curve."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from toolgym.agents.engines.vllm import kv_bytes_per_token
from toolgym.algorithms import SFTConfig, StageClock
from toolgym.algorithms.tracking import smoothed
from toolgym.algorithms.warmup_cache import load_warmup, store_warmup
from toolgym.runtime.stages import current_rss_bytes
from toolgym.testing import tiny_model, tiny_tokenizer

MB = 1 << 20


def touch(megabytes: int) -> torch.Tensor:
    """A tensor whose pages are all resident."""
    return torch.ones(megabytes * MB, dtype=torch.uint8)


@pytest.mark.skipif(StageClock()._exact is False, reason="needs /proc/self/clear_refs")
def test_each_stage_gets_its_own_peak_and_the_run_keeps_the_highest():
    clock = StageClock()
    base = current_rss_bytes()
    with clock.stage("big"):
        block = touch(300)
        del block
    with clock.stage("small"):
        block = touch(20)
        del block
    big, small = clock.records["big"], clock.records["small"]
    assert big.peak_bytes >= base + 290 * MB
    assert small.peak_bytes < big.peak_bytes - 200 * MB  # the big block's mark was reset
    block = touch(400)  # outside any stage: still the run's peak
    del block
    assert clock.peak_bytes() >= base + 390 * MB
    assert big.calls == small.calls == 1 and big.seconds > 0


@pytest.mark.skipif(StageClock()._exact is False, reason="needs /proc/self/clear_refs")
def test_a_peak_during_overlapping_stages_counts_for_both():
    clock = StageClock()
    base = current_rss_bytes()
    entered, release = threading.Event(), threading.Event()

    def background() -> None:
        with clock.stage("rollouts"):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=background)
    thread.start()
    entered.wait(10)
    with clock.stage("update"):
        block = touch(300)
        del block
        time.sleep(0.01)
    release.set()
    thread.join()
    assert clock.records["update"].peak_bytes >= base + 290 * MB
    assert clock.records["rollouts"].peak_bytes >= base + 290 * MB
    assert "whole run" in clock.table() and "rollouts" in clock.table()


def test_smoothing_follows_the_level_and_refuses_a_weight_of_one():
    assert smoothed([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0
    assert smoothed([1.0, 0.0], weight=0) == [1.0, 0.0]
    values = smoothed([0.0] * 10 + [1.0] * 10)
    assert values[9] == 0 and 0.5 < values[-1] < 1
    with pytest.raises(ValueError):
        smoothed([1.0], weight=1)


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer(tmp_path):
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer, hidden_size=64, layers=3).save_pretrained(tmp_path)
    # 3 layers x (keys + values) x 2 KV heads x head size 16 x 4 bytes
    assert kv_bytes_per_token(str(tmp_path), "float32") == 3 * 2 * 2 * 16 * 4
    assert kv_bytes_per_token(str(tmp_path), "bfloat16") == 3 * 2 * 2 * 16 * 2


def test_an_unreadable_cache_entry_is_a_miss_and_makes_room(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=1)
    entry = store_warmup(tmp_path, "k", model, [1.0, 0.5])
    other = tiny_model(tokenizer, seed=2)
    assert load_warmup(tmp_path, "k", other) == [1.0, 0.5]
    pairs = zip(model.parameters(), other.parameters(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)
    assert store_warmup(tmp_path, "k", other, [9.0]) == entry  # the first one stays
    assert load_warmup(tmp_path, "k", other) == [1.0, 0.5]
    (entry / "model.safetensors").write_bytes(b"truncated")
    assert load_warmup(tmp_path, "k", other) is None and not entry.exists()
    assert load_warmup(tmp_path, "missing", other) is None
    assert not list(tmp_path.glob("warmup/.partial-*"))


def test_sft_refuses_a_micro_batch_larger_than_its_step():
    from toolgym.algorithms import warmup_sft

    model = tiny_model(tiny_tokenizer())
    with pytest.raises(ValueError, match="micro_batch_size"):
        warmup_sft(model, [], 0, SFTConfig(batch_size=4, micro_batch_size=8))
