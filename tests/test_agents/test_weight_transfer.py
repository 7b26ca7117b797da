"""Weights to real vLLM servers through vLLM's own weight-transfer API (`weight_sync=
"toolgym-gloo"`): the same weights arrive as through the safetensors folder, nothing is
written to disk, a restarted server gets a new group. (A server started without the transfer
config is refused with a message that says how to start it: tests/test_agents/test_server_pool.py,
whose servers have none.)"""

from __future__ import annotations

import json

import pytest
from vllm_servers import (
    Servers,
    decisive,
    greedy,
    greedy_on,
    needs_vllm,
    perturbed,
    same_policy,
    wait_for,
)

from toolgym.testing import tiny_model, tiny_tokenizer

pytestmark = [pytest.mark.vllm, needs_vllm]

TRANSFER = ("--weight-transfer-config", json.dumps({"backend": "toolgym-gloo"}))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One server of a tiny random model that takes weights both ways (transfer config and
    `VLLM_SERVER_DEV_MODE=1` for the folder's `/collective_rpc`)."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=5, hidden_size=128)
    decisive(model.state_dict(), tokenizer)
    folder = tmp_path_factory.mktemp("transfer-model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    servers = Servers(folder, tmp_path_factory.mktemp("transfer-servers"), options=TRANSFER)
    try:
        url = servers.start()
        servers.wait(url)
        yield servers, url, tokenizer, model
    finally:
        servers.close()


def another_policy(model, tokenizer, seed: int) -> dict:
    """Other weights of the same shapes, tied where the model ties them (as a trainer's state
    dict is: `perturbed` moves the head and the embeddings apart, and which of the two a
    server keeps then depends on the order it reads them)."""
    state = perturbed(model, tokenizer, seed)
    state["model.embed_tokens.weight"] = state["lm_head.weight"]
    return state


def engine_for(url: str, weight_sync: str, folder, probe_interval: float = 0.2):
    from toolgym.agents.engines.server import VLLMServerEngine

    return VLLMServerEngine(
        url, weights_dir=str(folder), weight_sync=weight_sync, probe_interval=probe_interval,
        wait_for_server=240,
    )  # fmt: skip


def test_the_transfer_delivers_exactly_what_the_folder_does_and_writes_nothing(served, tmp_path):
    _, url, tokenizer, model = served
    first = greedy_on(url, 16)
    other = another_policy(model, tokenizer, seed=11)
    (tmp_path / "transfer").mkdir()
    # Two engines that each sync the server would each put back their own weights when their
    # probe finds the other's version on it: here their probes never run (one trainer per
    # set of servers, as in a run).
    by_transfer = engine_for(url, "toolgym-gloo", tmp_path / "transfer", probe_interval=3600)
    by_folder = engine_for(url, "folder", tmp_path / "folder", probe_interval=3600)
    try:
        by_transfer.update_weights(other)
        moved = greedy_on(url, 16)
        assert not same_policy(moved, first)
        by_folder.update_weights(model.state_dict())
        assert same_policy(greedy_on(url, 16), first, tolerance=1e-6)
        by_folder.update_weights(other)
        assert same_policy(greedy_on(url, 16), moved, tolerance=1e-6)
        by_transfer.update_weights(model.state_dict())  # the group stays open across syncs
        assert same_policy(greedy_on(url, 16), first, tolerance=1e-6)
        assert not any((tmp_path / "transfer").iterdir())
        assert (tmp_path / "folder" / "policy" / "model.safetensors").exists()
    finally:
        by_transfer.close()
        by_folder.close()


def test_a_restarted_server_gets_a_new_group_and_the_current_weights(served, tmp_path):
    """A request finds the server gone (it is taken out) and waits; the server restarts from
    its first weights; the probe opens a new group, gives it the current weights, and only
    then does the request run."""
    servers, url, tokenizer, model = served
    engine = engine_for(url, "toolgym-gloo", tmp_path)
    try:
        engine.update_weights(another_policy(model, tokenizer, seed=12))
        current = greedy_on(url, 16)
        servers.kill(url)
        waiting = engine.submit(greedy(16))
        wait_for(lambda: not engine.stats()[url]["up"], timeout=30)
        servers.start(url)
        assert same_policy(waiting.result(timeout=240), current, tolerance=1e-6)
        assert same_policy(greedy_on(url, 16), current, tolerance=1e-6)
        engine.update_weights(model.state_dict())  # and the new group carries on
        assert not same_policy(greedy_on(url, 16), current)
    finally:
        engine.close()


def test_a_silent_restart_is_caught_and_a_following_pool_waits_for_the_leaders_sync(
    served, tmp_path
):
    """The server restarts between two probes, with no request in flight to notice it: the
    leading pool's probe finds vLLM's "default" version where its own tag was, takes it out
    and syncs it again. A second pool that follows (another trainer process's: `advance`,
    never a sync) lets it in only once it reports the current version."""
    servers, url, tokenizer, model = served
    leader = engine_for(url, "toolgym-gloo", tmp_path / "leader")
    follower = engine_for(url, "toolgym-gloo", tmp_path / "follower")
    try:
        leader.update_weights(another_policy(model, tokenizer, seed=13))
        follower.pool.advance()
        current = greedy_on(url, 16)
        assert same_policy(follower.submit(greedy(16)).result(timeout=60), current, 1e-6)
        servers.kill(url)
        servers.start(url)
        servers.wait(url)
        wait_for(lambda: not follower.stats()[url]["up"], timeout=30)  # "default": not current
        answer = follower.submit(greedy(16))  # waits for a server with the current weights
        assert same_policy(answer.result(timeout=120), current, tolerance=1e-6)
        assert same_policy(greedy_on(url, 16), current, tolerance=1e-6)
        assert leader.stats()[url]["up"] and follower.stats()[url]["up"]
    finally:
        leader.close()
        follower.close()


def test_an_unknown_weight_sync_is_named():
    from toolgym.agents.engines.server_sync import make_weight_sync

    with pytest.raises(ValueError, match="folder, toolgym-gloo, nccl"):
        make_weight_sync("rsync", None, 1.0)  # type: ignore[arg-type]
