"""The OpenAI-compatible endpoint: an agent program nobody here wrote (the `openai` client's
own tool loop) plays Wordle through it, and what the endpoint records is token for token what
toolgym's own chat loop records for the same model; bad requests get OpenAI-style errors."""

from __future__ import annotations

import json
import threading

import pytest
from helpers import GUESS, ids, scripted_agent, wordle_rows

import toolgym
from toolgym.agents import ScriptedEngine
from toolgym.agents.endpoint import Endpoint
from toolgym.testing import tiny_tokenizer

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

WORDS = ("slate", "moist", "crane")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


_OPEN: list = []  # clients to close after each test: an unclosed one warns when collected


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(endpoint: Endpoint, key: str):
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0, timeout=30)
    _OPEN.append(client)
    return client


def play_with_openai_client(client, env, messages: list[dict]) -> list[dict]:
    """A plain agent program: the openai client's chat completions with tools, calling the
    environment's tools itself until the model answers or the game ends."""
    messages = list(messages)
    for _ in range(6):
        reply = client.chat.completions.create(model="toolgym", messages=messages, tools=env.tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        calls = [
            toolgym.ToolCall(c.function.name, json.loads(c.function.arguments), c.id)
            for c in message.tool_calls
        ]
        step = env.step(calls)
        for call, result in zip(message.tool_calls, step.messages, strict=True):
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result["content"]})
        if step.terminated:
            break
    return messages


def test_an_openai_client_loop_is_recorded_exactly_as_toolgym_s_own_loop(tokenizer):
    replies = [ids(tokenizer, GUESS.format(word=word)) for word in WORDS]
    (row,) = wordle_rows(1)
    # toolgym's own chat loop, the reference
    (reference,) = scripted_agent(tokenizer, [GUESS.format(word=w) for w in WORDS]).run(
        [toolgym.make("Wordle-v0")], [row], [0]
    )
    env = toolgym.make("Wordle-v0")
    first = env.reset(seed=0, **{k: v for k, v in row.items() if k != "prompt"})
    prompt = [*row["prompt"][:-1], dict(row["prompt"][-1])]
    if first:  # as toolgym's loop shows reset's observation
        prompt[-1]["content"] += f"\n\n{first}"
    with Endpoint(ScriptedEngine(replies), tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        messages = play_with_openai_client(_client(endpoint, key), env, prompt)
        recorded = endpoint.trajectory(key)
    assert env.done and [m["role"] for m in messages].count("assistant") == 3
    assert recorded.metrics["turns"] == 3 and recorded.metrics["joined_calls"] == 2
    # the same ids, the same masks: sampled tokens kept as sampled, tool results as the
    # template writes them after an assistant turn (mask 0)
    assert recorded.prompt_ids == reference.prompt_ids
    assert recorded.completion_ids == reference.completion_ids
    assert recorded.loss_mask == reference.loss_mask
    sampled = [t for t, m in zip(recorded.completion_ids, recorded.loss_mask, strict=True) if m]
    assert sampled == [token for reply in replies for token in reply]


def test_a_changed_history_starts_a_new_sample_from_what_the_engine_saw(tokenizer):
    """A program that rewrites the conversation (here: drops the tool results' order) is not
    joined: the new call is a sample of its own whose prompt is exactly what the engine got."""
    seen = []

    def reply(prompt_ids):
        seen.append(list(prompt_ids))
        return ids(tokenizer, "done<|im_end|>")

    with Endpoint(ScriptedEngine(reply), tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        client = _client(endpoint, key)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        recorded = endpoint.trajectory(key)
    assert len(recorded.samples) == 2 and recorded.metrics["joined_calls"] == 0
    assert [sample.prompt_ids for sample in recorded.samples] == seen


def test_streaming_answers_in_openai_chunks(tokenizer):
    engine = ScriptedEngine([ids(tokenizer, GUESS.format(word="slate"))])
    env = toolgym.make("Wordle-v0")
    with Endpoint(engine, tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        stream = _client(endpoint, key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], tools=env.tools, stream=True
        )
        chunks = list(stream)
    calls = [
        c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls
    ]
    assert calls and calls[0][0].function.name == "guess"
    assert json.loads(calls[0][0].function.arguments) == {"word": "slate"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_bad_requests_get_openai_errors_and_lose_nothing(tokenizer):
    import httpx

    engine = ScriptedEngine([ids(tokenizer, "fine<|im_end|>")])
    with Endpoint(engine, tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session()
        with pytest.raises(openai.AuthenticationError, match="unknown session"):
            _client(endpoint, "not-a-session").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        client = _client(endpoint, key)
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                tool_choice={"type": "function", "function": {"name": "no_such_tool"}},
            )
        url = f"{endpoint.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {key}"}
        headers["Content-Type"] = "application/json"
        bad_json = httpx.post(url, content=b"{not json", headers=headers)
        assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
        huge = httpx.post(url, content=b"x" * (9 * 2**20), headers=headers)
        assert huge.status_code == 413
        no_messages = httpx.post(url, json={"messages": []}, headers=headers)
        assert no_messages.json()["error"]["code"] == "invalid_messages"
        # the session is untouched by all of that, and answers
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "fine"
        assert endpoint.trajectory(key).metrics["turns"] == 1
        models = httpx.get(f"{endpoint.base_url}/models").json()
        assert models["data"][0]["id"] == "toolgym"


def test_limits_end_a_session_with_a_named_status(tokenizer):
    from toolgym.agents import AgentLimits

    engine = ScriptedEngine([ids(tokenizer, "again<|im_end|>")])
    limits = AgentLimits(max_turns=2)
    with Endpoint(engine, tokenizer, parser="hermes", limits=limits) as endpoint:
        key = endpoint.open_session()
        client = _client(endpoint, key)
        for _ in range(2):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match="calls are used"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert endpoint.trajectory(key).status == "max_turns"


def test_64_concurrent_sessions_each_keep_their_own_record(tokenizer):
    engine = ScriptedEngine(lambda prompt_ids: ids(tokenizer, "ok<|im_end|>"))
    with Endpoint(engine, tokenizer, parser="hermes") as endpoint:
        keys = [endpoint.open_session() for _ in range(64)]
        errors = []

        def one(key: str, index: int) -> None:
            try:
                _client(endpoint, key).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"session {index}"}]
                )
            except Exception as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=one, args=(k, i)) for i, k in enumerate(keys)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        for index, key in enumerate(keys):
            recorded = endpoint.trajectory(key)
            assert f"session {index}" in tokenizer.decode(recorded.prompt_ids)
            assert recorded.metrics["turns"] == 1


def test_toolgym_endpoint_serves_a_model_folder(tmp_path, tokenizer):
    """The command line: a tiny model folder served on a free port; the openai client's
    answer comes from the model, and the process ends on SIGTERM."""
    import signal
    import subprocess
    import sys

    from toolgym.testing import tiny_model

    tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    command = [sys.executable, "-m", "toolgym", "endpoint", "--model", str(tmp_path)]
    server = subprocess.Popen(
        [*command, "--port", "0", "--max-new-tokens", "8"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        base_url = server.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), base_url
        client = openai.OpenAI(base_url=base_url, api_key="any-key", max_retries=0, timeout=60)
        _OPEN.append(client)
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert answer.usage.completion_tokens <= 8 and answer.choices[0].finish_reason
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()


async def openai_program(base_url, api_key, row, env):
    """An agent program as people write them: the openai client's async tool loop."""
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=60
    ) as client:
        messages = list(row["prompt"])
        for _ in range(6):
            reply = await client.chat.completions.create(
                model="toolgym", messages=messages, tools=env.tools
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            calls = [
                toolgym.ToolCall(c.function.name, json.loads(c.function.arguments), c.id)
                for c in message.tool_calls
            ]
            step = await env.astep(calls)
            for call, result in zip(message.tool_calls, step.messages, strict=True):
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": result["content"]}
                )
            if step.terminated:
                break
    return None  # the environment scores it


def test_a_program_is_a_rollout_function_recorded_exactly(tokenizer):
    from toolgym.agents.program import program_rollout

    replies = [GUESS.format(word=w) for w in WORDS]
    (row,) = wordle_rows(1)
    (reference,) = scripted_agent(tokenizer, replies).run([toolgym.make("Wordle-v0")], [row], [0])
    agent = scripted_agent(tokenizer, replies)
    (played,) = agent.run(
        [toolgym.make("Wordle-v0")], [row], [0], rollout_fn=program_rollout(openai_program)
    )
    assert played.status == "finished" and played.reward == reference.reward > 0
    assert played.metrics["turns"] == 3
    assert played.prompt_ids == reference.prompt_ids
    assert played.completion_ids == reference.completion_ids
    assert played.loss_mask == reference.loss_mask


def test_a_program_that_fails_or_passes_the_limits_ends_with_a_named_status(tokenizer):
    from toolgym.agents.program import program_rollout

    async def crashes(base_url, api_key, row, env):
        raise RuntimeError("the model's text broke the agent")

    async def own_bug(base_url, api_key, row, env):
        raise toolgym.EnvironmentBug("the agent's own bug")

    agent = scripted_agent(tokenizer, ["again<|im_end|>"], max_turns=1)
    wordle = toolgym.make("Wordle-v0")
    # a program handles the model's text: its failure is the model's unless it says otherwise
    (crashed,) = agent.run([wordle], wordle_rows(1), rollout_fn=program_rollout(crashes))
    assert crashed.status == "tool_crash" and "the model's text broke" in crashed.error
    (bug,) = agent.run([wordle], wordle_rows(1), rollout_fn=program_rollout(own_bug))
    assert bug.status == "env_error" and "the agent's own bug" in bug.error

    async def chats_forever(base_url, api_key, row, env):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            while True:
                await client.chat.completions.create(model="m", messages=row["prompt"])

    (limited,) = agent.run([wordle], wordle_rows(1), rollout_fn=program_rollout(chats_forever))
    assert limited.status == "max_turns" and limited.metrics["turns"] == 1
