"""Agent programs nobody here wrote, from PyPI, playing Wordle's tools through the endpoint:
the OpenAI Agents SDK (`openai-agents`, its chat-completions model over an `AsyncOpenAI`
client) and smolagents (`ToolCallingAgent` over `OpenAIServerModel`). For each: what the
session records decodes exactly to what the model sampled and what the program sent back,
the sampled tokens are the engine's, and a GRPO step trains on it through `program_rollout`.
Also the bad requests `tests/test_agents/test_endpoint.py` leaves out: bad requests in the middle of
a joined session, a body over the limit sent without a length, and 64 concurrent SDK sessions.

Tracing is off (`OPENAI_AGENTS_DISABLE_TRACING`, `set_tracing_disabled`); nothing leaves
loopback. The engine is scripted where the test needs tool calls, a tiny random model where a
GRPO step trains (no assertion depends on what it writes).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
from typing import ClassVar

import pytest
from helpers import GUESS, ids, wordle_rows

import toolgym
from toolgym.agents import AgentLimits, ScriptedEngine
from toolgym.agents.endpoint import Endpoint
from toolgym.agents.endpoint.request import for_template
from toolgym.agents.program import program_rollout
from toolgym.testing import tiny_model, tiny_tokenizer

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # before the SDK is imported
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

WORDS = ("slate", "moist", "crane")
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def sdk():
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    return agents


@pytest.fixture(autouse=True)
def _no_thread_left():
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for thread in left:  # the endpoint's server thread and to_thread workers end on their own
        thread.join(timeout=10)
    assert not [t.name for t in left if t.is_alive() and not t.daemon]


class Script:
    """A scripted engine's script that keeps what the engine saw and what it sampled."""

    def __init__(self, tokenizer, replies):
        self.replies = [ids(tokenizer, r) for r in replies]
        self.seen: list[list[int]] = []
        self.sampled: list[list[int]] = []

    def __call__(self, prompt_ids):
        reply = self.replies[min(len(self.seen), len(self.replies) - 1)]
        self.seen.append(list(prompt_ids))
        self.sampled.append(reply)
        return reply


def request_recorder(bodies: list[dict]):
    """An httpx event hook keeping each chat-completion body the library sent."""

    def keep(request) -> None:
        if request.url.path.endswith("/chat/completions"):
            bodies.append(json.loads(request.content))

    async def keep_async(request) -> None:
        keep(request)

    return keep, keep_async


def wordle_env(answer: str = "crane"):
    env = toolgym.make("Wordle-v0")
    env.reset(seed=0, answer=answer)
    return env


def parsed_arguments(arguments: str | dict) -> dict | str:
    """A tool call's arguments as the tool gets them; an error text for arguments that are not
    JSON (the program answers the model with it)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError as error:
        return f"Error: the arguments are not JSON: {error}"


def sent_back(step, results: list[str] | None) -> str:
    """What a library's tool wrapper returns to the library: the tool message's text."""
    content = step.messages[0]["content"]
    if results is not None:
        results.append(content)
    return content


def sdk_tools(sdk, env, results: list[str] | None = None) -> list:
    """The environment's tools as the Agents SDK's `FunctionTool`s (schemas as toolgym
    writes them)."""

    def one(schema: dict):
        function = schema["function"]

        async def invoke(context, arguments: str) -> str:
            parsed = parsed_arguments(arguments)
            if isinstance(parsed, str):
                return parsed
            step = await env.astep([toolgym.ToolCall(function["name"], parsed)])
            return sent_back(step, results)

        return sdk.FunctionTool(
            name=function["name"],
            description=function.get("description", ""),
            params_json_schema=function["parameters"],
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    return [one(schema) for schema in env.tools]


def smol_tools(env, results: list[str] | None = None) -> list:
    """The environment's tools as smolagents `Tool`s (its sync agent runs them in its thread)."""
    from smolagents import Tool

    def one(schema: dict):
        function = schema["function"]
        properties = function["parameters"]["properties"]

        class EnvTool(Tool):
            name = function["name"]
            description = function.get("description", name)
            inputs: ClassVar[dict] = {
                key: {"type": value["type"], "description": value.get("description", key)}
                for key, value in properties.items()
            }
            output_type = "string"
            skip_forward_signature_validation = True

            def forward(self, **arguments):
                step = env.step([toolgym.ToolCall(function["name"], arguments)])
                return sent_back(step, results)

        return EnvTool()

    return [one(schema) for schema in env.tools]


async def play_with_agents_sdk(sdk, base_url, api_key, prompt, env, results=None, bodies=None):
    """The OpenAI Agents SDK's own loop: `Runner.run` over its chat-completions model."""
    hooks = {"request": [request_recorder(bodies)[1]]} if bodies is not None else {}
    async with (
        httpx.AsyncClient(event_hooks=hooks) as http,
        openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=60, http_client=http
        ) as client,
    ):
        agent = sdk.Agent(
            name="wordle",
            instructions="You play Wordle with the guess tool.",
            tools=sdk_tools(sdk, env, results),
            model=sdk.OpenAIChatCompletionsModel(model="toolgym", openai_client=client),
        )
        try:
            result = await sdk.Runner.run(
                agent, prompt, max_turns=6, run_config=sdk.RunConfig(tracing_disabled=True)
            )
        except sdk.MaxTurnsExceeded:
            return None
        return result.final_output


def play_with_smolagents(base_url, api_key, task, env, results=None, bodies=None, max_steps=6):
    """smolagents' own loop: a `ToolCallingAgent` over `OpenAIServerModel`."""
    from smolagents import OpenAIServerModel, ToolCallingAgent

    hooks = {"request": [request_recorder(bodies)[0]]} if bodies is not None else {}
    with httpx.Client(event_hooks=hooks) as http:
        model = OpenAIServerModel(
            model_id="toolgym",
            api_base=base_url,
            api_key=api_key,
            client_kwargs={"max_retries": 0, "timeout": 60, "http_client": http},
        )
        agent = ToolCallingAgent(
            tools=smol_tools(env, results), model=model, max_steps=max_steps, verbosity_level=-1
        )
        try:
            return agent.run(task)
        finally:
            model.client.close()


def rendered(tokenizer, body: dict) -> str:
    """The chat template's own rendering of a request body, with the generation prompt."""
    return tokenizer.apply_chat_template(
        [for_template(m) for m in body["messages"]],
        tools=body.get("tools") or None,
        tokenize=False,
        add_generation_prompt=True,
    )


def test_the_agents_sdk_plays_wordle_and_is_recorded_exactly(tokenizer, sdk):
    script = Script(tokenizer, [*(GUESS.format(word=w) for w in WORDS), "I won.<|im_end|>"])
    env, results, bodies = wordle_env(), [], []
    with Endpoint(ScriptedEngine(script), tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        final = asyncio.run(
            play_with_agents_sdk(
                sdk, endpoint.base_url, key, "Find the word.", env, results, bodies
            )
        )
        recorded = endpoint.trajectory(key)
    assert final == "I won." and env.done and env.reward > 0 and len(results) == 3
    # the SDK sends the history back as it got it: the four calls join into one sequence
    (sample,) = recorded.samples
    assert recorded.metrics["turns"] == 4 and recorded.metrics["joined_calls"] == 3
    sequence = sample.prompt_ids + sample.completion_ids
    mask = [0] * len(sample.prompt_ids) + sample.loss_mask
    # sampled tokens are the engine's, in order; every prompt the engine saw is the record so far
    sampled = [t for t, m in zip(sequence, mask, strict=True) if m]
    assert sampled == [t for reply in script.sampled for t in reply]
    for seen in script.seen:
        assert sequence[: len(seen)] == seen
    # what was not sampled is what the program sent back, in the template's own words: the
    # first request rendered, then per call the tool results rendered after the assistant turn
    assert tokenizer.decode(sample.prompt_ids, skip_special_tokens=False) == rendered(
        tokenizer, bodies[0]
    )
    segments = observation_segments(tokenizer, sample)
    assert len(segments) == 3
    for segment, body, result in zip(segments, bodies[1:], results, strict=True):
        (tool_message,) = [m for m in body["messages"] if m["role"] == "tool"][-1:]
        assert tool_message["content"] == result  # the SDK sent the tool's result as it was
        after_turn = rendered(tokenizer, body)
        assert after_turn.endswith(segment) and result in segment
    whole = tokenizer.decode(sequence, skip_special_tokens=False)
    last = tokenizer.decode(script.sampled[-1], skip_special_tokens=False)
    assert whole == rendered(tokenizer, bodies[-1]) + last


def observation_segments(tokenizer, sample) -> list[str]:
    """The decoded runs of mask-0 tokens inside the completion."""
    segments, run = [], []
    for token, mask in zip(sample.completion_ids, sample.loss_mask, strict=True):
        if mask:
            if run:
                segments.append(tokenizer.decode(run, skip_special_tokens=False))
            run = []
        else:
            run.append(token)
    return segments


def test_smolagents_plays_wordle_and_is_recorded_exactly(tokenizer):
    pytest.importorskip("smolagents")
    replies = [GUESS.format(word=w) for w in WORDS]
    replies.append(CALL.format(name="final_answer", arguments='{"answer": "crane"}'))
    script = Script(tokenizer, replies)
    engine = ScriptedEngine(script, context_length=16_384, tokenizer=tokenizer)
    env, results, bodies = wordle_env(), [], []
    with Endpoint(engine, tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        final = play_with_smolagents(endpoint.base_url, key, "Play Wordle.", env, results, bodies)
        recorded = endpoint.trajectory(key)
    assert final == "crane" and env.done and env.reward > 0 and len(results) == 3
    # smolagents asks for tool_choice "required" and stops at "Observation:" on every call
    assert {b.get("tool_choice") for b in bodies} == {"required"}
    assert all("Observation:" in b.get("stop", []) for b in bodies)
    # it rewrites its history (a call becomes the text "Calling tools: [...]", a result a user
    # turn "Observation: ..."), so no call extends the last: one sample per call, each prompt
    # the template's rendering of what the program sent, each completion what was sampled
    assert recorded.metrics["turns"] == 4 and recorded.metrics["joined_calls"] == 0
    assert len(recorded.samples) == len(bodies) == 4
    for sample, body, seen, sampled in zip(
        recorded.samples, bodies, script.seen, script.sampled, strict=True
    ):
        assert sample.prompt_ids == seen
        assert sample.completion_ids == sampled and set(sample.loss_mask) == {1}
        assert tokenizer.decode(seen, skip_special_tokens=False) == rendered(tokenizer, body)
    for result, body in zip(results, bodies[1:], strict=True):  # sent back, as it was
        assert result in json.dumps(body["messages"][-1], ensure_ascii=False).replace("\\n", "\n")


def grpo_args(tmp_path, **limits):
    from toolgym.algorithms import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        prompts_per_step=1,
        num_generations=2,
        micro_batch_size=2,
        limits=AgentLimits(**{"max_turns": 4, "max_new_tokens": 12, **limits}),
        parser="hermes",
        learning_rate=1e-2,
        progress_bar=False,
        save_steps=0,
    )


def by_position(prompts, completions, trajectories, **_):
    """A reward that differs within every group, whatever the model wrote: the step has a
    gradient on every machine."""
    return [float(index) for index in range(len(trajectories))]


def train_one_step(tokenizer, tmp_path, program, **limits):
    import torch

    from toolgym.agents.trajectory import load_jsonl
    from toolgym.algorithms import GRPOTrainer

    torch.manual_seed(0)
    model = tiny_model(tokenizer, seed=3)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = GRPOTrainer(
        model,
        "Wordle-v0",
        wordle_rows(2),
        reward_funcs=[by_position],
        args=grpo_args(tmp_path, **limits),
        tokenizer=tokenizer,
        rollout_fn=program_rollout(program, timeout=120),
    )
    (metrics,) = trainer.train()
    episodes = load_jsonl(tmp_path / "samples.jsonl")
    after = trainer.learner.policy.parameters()
    changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return metrics, episodes, changed


def test_a_grpo_step_trains_on_agents_sdk_episodes(tokenizer, sdk, tmp_path):
    async def program(base_url, api_key, row, env):
        await play_with_agents_sdk(sdk, base_url, api_key, row["prompt"], env)
        return None

    metrics, episodes, changed = train_one_step(tokenizer, tmp_path, program)
    assert math.isfinite(metrics["loss"]) and len(episodes) == 2
    for episode in episodes:
        assert episode.status not in ("env_error", "engine_error"), episode.error
        assert episode.model_tokens > 0 and sum(episode.loss_mask) == episode.model_tokens
        prompt = tokenizer.decode(episode.samples[0].prompt_ids, skip_special_tokens=False)
        assert "You play Wordle with the guess tool." in prompt  # the SDK's instructions
    assert metrics["reward_std"] > 0 and changed


def test_a_grpo_step_trains_on_smolagents_episodes(tokenizer, tmp_path):
    pytest.importorskip("smolagents")

    async def program(base_url, api_key, row, env):
        task = row["prompt"][-1]["content"]
        await asyncio.to_thread(play_with_smolagents, base_url, api_key, task, env, max_steps=1)
        return None

    metrics, episodes, changed = train_one_step(tokenizer, tmp_path, program)
    assert math.isfinite(metrics["loss"]) and len(episodes) == 2
    for episode in episodes:
        assert episode.status not in ("env_error", "engine_error"), episode.error
        assert episode.model_tokens > 0
        prompt = tokenizer.decode(episode.samples[0].prompt_ids, skip_special_tokens=False)
        assert "final_answer" in prompt  # smolagents' own system prompt and tool
    assert metrics["reward_std"] > 0 and changed


def test_bad_requests_inside_a_joined_session_lose_nothing(tokenizer, sdk):
    """Between the calls of a session that joins, bad requests come in (malformed JSON, an
    unknown tool choice, a body over the limit with no length given, messages that are not
    messages): each gets an OpenAI-style error, and the session goes on joining as if they
    had never been sent."""
    script = Script(tokenizer, [*(GUESS.format(word=w) for w in WORDS), "I won.<|im_end|>"])
    env = wordle_env()
    with Endpoint(ScriptedEngine(script), tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        url = f"{endpoint.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        answers = []

        def hostile(request) -> None:  # each time the SDK calls, bad requests go first
            if not request.url.path.endswith("/chat/completions"):
                return
            body = json.loads(request.content)
            with httpx.Client(headers=headers, timeout=30) as bad:
                answers.append(bad.post(url, content=b'{"messages": [}'))
                answers.append(bad.post(url, json={**body, "tool_choice": "sometimes"}))
                answers.append(bad.post(url, json={**body, "messages": [{"role": "robot"}]}))
                answers.append(bad.post(url, json={**body, "n": 3}))
                chunks = (b"x" * 2**20 for _ in range(9))  # chunked: no Content-Length
                answers.append(bad.post(url, content=chunks))

        async def hostile_async(request) -> None:
            await asyncio.to_thread(hostile, request)

        async def play():
            async with (
                httpx.AsyncClient(event_hooks={"request": [hostile_async]}) as http,
                openai.AsyncOpenAI(
                    base_url=endpoint.base_url, api_key=key, max_retries=0, http_client=http
                ) as client,
            ):
                agent = sdk.Agent(
                    name="wordle",
                    instructions="You play Wordle with the guess tool.",
                    tools=sdk_tools(sdk, env),
                    model=sdk.OpenAIChatCompletionsModel(model="toolgym", openai_client=client),
                )
                config = sdk.RunConfig(tracing_disabled=True)
                return await sdk.Runner.run(agent, "Go.", max_turns=6, run_config=config)

        result = asyncio.run(play())
        recorded = endpoint.trajectory(key)
    assert result.final_output == "I won." and len(answers) == 4 * 5
    codes = [(a.status_code, a.json()["error"]["code"]) for a in answers[:5]]
    assert codes == [
        (400, "invalid_json"),
        (400, "invalid_tool_choice"),
        (400, "invalid_messages"),
        (400, "invalid_n"),
        (413, "body_too_large"),
    ]
    assert all(a.json()["error"]["type"] for a in answers)
    assert [(a.status_code, a.json()["error"]["code"]) for a in answers[5:10]] == codes
    assert recorded.metrics["turns"] == 4 and recorded.metrics["joined_calls"] == 3
    sampled = [t for t, m in zip(recorded.completion_ids, recorded.loss_mask, strict=True) if m]
    assert sampled == [t for reply in script.sampled for t in reply] and len(script.seen) == 4


def test_64_concurrent_agents_sdk_sessions_each_record_their_own_game(tokenizer, sdk):
    """64 SDK agents at once, each its own session and its own game; the scripted model
    guesses by what its own prompt holds, so a mixed-up session would show."""
    answers = ["crane", "moist", "slate", "plumb"]

    def reply(prompt_ids):
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        turn = text.count("<tool_response>")
        if "Correct!" in text:
            return ids(tokenizer, "Done.<|im_end|>")
        return ids(tokenizer, GUESS.format(word=WORDS[turn % 3]))

    envs = [wordle_env(answers[i % 4]) for i in range(64)]
    with Endpoint(ScriptedEngine(reply), tokenizer, parser="hermes") as endpoint:
        keys = [endpoint.open_session() for _ in envs]

        async def play_all():
            return await asyncio.gather(
                *(
                    play_with_agents_sdk(sdk, endpoint.base_url, key, f"Game {i}.", env)
                    for i, (key, env) in enumerate(zip(keys, envs, strict=True))
                )
            )

        finals = asyncio.run(play_all())
        recorded = [endpoint.trajectory(key) for key in keys]
    for i, (final, env, trajectory) in enumerate(zip(finals, envs, recorded, strict=True)):
        (sample,) = trajectory.samples  # every call of the session joined
        text = tokenizer.decode(sample.prompt_ids + sample.completion_ids)
        assert f"Game {i}." in text and text.count("Game ") == 1
        # each call but the last answered a guess (a game lost ends at the SDK's max_turns,
        # its last guess's result never sent back)
        assert trajectory.metrics["turns"] == text.count("<tool_response>") + 1
        if answers[i % 4] in WORDS:
            assert final == "Done." and env.reward > 0


def test_requests_that_set_no_temperature_sample_at_the_run_s_own(tokenizer, sdk):
    """The SDK sends no temperature unless told: a program's episode then samples at the
    run's setting (greedy in a greedy evaluation), and a temperature the program sets wins."""
    from toolgym.agents import Agent, SamplingParams

    class Tapped(ScriptedEngine):
        """A scripted engine that keeps each request's sampling settings."""

        def __init__(self, replies):
            super().__init__(replies)
            self.settings: list[tuple[float, float]] = []

        def generate(self, requests):
            self.settings += [(r.sampling.temperature, r.sampling.top_p) for r in requests]
            return super().generate(requests)

    def program(settings):
        async def play(base_url, api_key, row, env):
            async with openai.AsyncOpenAI(
                base_url=base_url, api_key=api_key, max_retries=0
            ) as client:
                agent = sdk.Agent(
                    name="wordle",
                    tools=sdk_tools(sdk, env),
                    model=sdk.OpenAIChatCompletionsModel(model="toolgym", openai_client=client),
                    model_settings=sdk.ModelSettings(**settings),
                )
                config = sdk.RunConfig(tracing_disabled=True)
                await sdk.Runner.run(agent, row["prompt"], max_turns=2, run_config=config)

        return program_rollout(play)

    engine = Tapped([ids(tokenizer, "Hello.<|im_end|>")])
    agent = Agent(engine, tokenizer, parser="hermes")
    greedy = SamplingParams(temperature=0.0, top_p=1.0)
    rows = wordle_rows(1)
    agent.run([toolgym.make("Wordle-v0")], rows, rollout_fn=program({}), sampling=greedy)
    agent.run([toolgym.make("Wordle-v0")], rows, rollout_fn=program({}))
    chosen = program({"temperature": 0.7, "top_p": 0.9})
    agent.run([toolgym.make("Wordle-v0")], rows, rollout_fn=chosen, sampling=greedy)
    default = (agent.sampling.temperature, agent.sampling.top_p)
    assert engine.settings == [(0.0, 1.0), default, (0.7, 0.9)]


def test_the_sdk_s_default_responses_model_is_told_what_is_served(tokenizer, sdk):
    """The gap, written down: the Agents SDK's default model speaks the Responses API
    (`POST /responses`), which the endpoint does not serve (its record is per chat call). The
    answer is an OpenAI-style 404 naming the fix: the SDK's chat-completions model."""
    engine = ScriptedEngine([ids(tokenizer, "Hi.<|im_end|>")])
    with Endpoint(engine, tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()

        async def play():
            async with openai.AsyncOpenAI(
                base_url=endpoint.base_url, api_key=key, max_retries=0
            ) as client:
                model = sdk.OpenAIResponsesModel(model="toolgym", openai_client=client)
                agent = sdk.Agent(name="a", model=model)
                config = sdk.RunConfig(tracing_disabled=True)
                await sdk.Runner.run(agent, "Hello.", run_config=config)

        with pytest.raises(openai.NotFoundError, match="OpenAIChatCompletionsModel") as error:
            asyncio.run(play())
        assert error.value.body["code"] == "not_found"
        assert endpoint.trajectory(key).metrics["turns"] == 0  # nothing generated or recorded
        with httpx.Client() as http:
            wrong_method = http.get(f"{endpoint.base_url}/chat/completions")
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["code"] == "method_not_allowed"
