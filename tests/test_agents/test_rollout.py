"""Rollouts: exact tokens, masks, statuses, batching, and episodes that never wait for others."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from helpers import (
    GUESS,
    assert_token_exact,
    greedy_agent,
    ids,
    play_wordle_token_exact,
    scripted_agent,
    train_tool_caller,
    wordle_rows,
)

import toolgym
from toolgym.agents import (
    STATUSES,
    Agent,
    AgentLimits,
    HFEngine,
    SamplingParams,
    ScriptedEngine,
    load_jsonl,
    save_jsonl,
    summarize,
)
from toolgym.builtin_envs.wordle import Wordle
from toolgym.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_scripted_wordle_win_is_token_exact_with_observation_mask(tokenizer):
    replies = [GUESS.format(word="slate"), GUESS.format(word="crane")]
    agent = scripted_agent(tokenizer, replies)
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "env_done" and trajectory.reward == 1.0
    assert [m["role"] for m in trajectory.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    first_reply = ids(tokenizer, replies[0])
    n = len(first_reply)
    assert trajectory.completion_ids[:n] == first_reply
    assert trajectory.loss_mask[:n] == [1] * n
    suffix = agent.renderer.tool_suffix_ids(
        trajectory.messages[2:3], toolgym.make("Wordle-v0").tools
    )
    assert trajectory.completion_ids[n : n + len(suffix)] == suffix
    assert trajectory.loss_mask[n : n + len(suffix)] == [0] * len(suffix)
    assert "Guess 1/6" in tokenizer.decode(suffix)
    assert trajectory.loss_mask[n + len(suffix) :] == [1] * len(ids(tokenizer, replies[1]))
    assert_token_exact(agent, trajectory, toolgym.make("Wordle-v0").tools)
    assert trajectory.metrics["turns"] == 2 and trajectory.metrics["tool_calls"] == 2


@pytest.mark.parametrize(
    ("replies", "limits", "status"),
    [
        (["The word is crane.<|im_end|>"], {}, "finished"),
        ([GUESS.format(word="slate")], {"max_turns": 2}, "max_turns"),
        (["x" * 50], {"max_new_tokens": 5}, "length"),
        ([GUESS.format(word="slate")], {"max_episode_tokens": 60}, "length"),
    ],
)
def test_episode_statuses(tokenizer, replies, limits, status):
    agent = scripted_agent(tokenizer, replies, **limits)
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == status
    assert len(trajectory.completion_ids) <= limits.get("max_episode_tokens", 10**9)


def test_malformed_calls_are_answered_and_counted(tokenizer):
    agent = scripted_agent(
        tokenizer, ['<tool_call>{"name": "guess", </tool_call><|im_end|>'], max_turns=2
    )
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "max_turns"
    assert trajectory.metrics["parse_failures"] == 2 and trajectory.metrics["tool_failures"] == 2
    assert "could not parse the tool call" in trajectory.messages[2]["content"]


def test_context_length_is_checked_before_a_request(tokenizer):
    engine = ScriptedEngine([ids(tokenizer, GUESS.format(word="slate"))], context_length=520)
    agent = Agent(engine, tokenizer, parser="hermes")
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "length"
    assert len(trajectory.prompt_ids) + len(trajectory.completion_ids) <= 520


class SlowTools(toolgym.Environment):
    def reset(self, delay: float = 0.0) -> str | None:
        self.delay = delay
        return "Call wait once."

    async def wait(self) -> str:
        """Wait for a while."""
        await asyncio.sleep(self.delay)
        self.done = True
        return "waited"


def test_a_slow_tool_holds_back_only_its_own_episode(tokenizer):
    reply = '<tool_call>{"name": "wait", "arguments": {}}</tool_call><|im_end|>'
    engine = ScriptedEngine([ids(tokenizer, reply)])
    agent = Agent(engine, tokenizer, parser="hermes")

    async def play():
        finished = {}

        async def one(delay):
            (trajectory,) = await agent.arun([SlowTools()], [{"delay": delay}])
            finished[delay] = time.perf_counter()
            return trajectory

        started = time.perf_counter()
        await asyncio.gather(one(1.0), one(0.0), one(0.0))
        return {d: t - started for d, t in finished.items()}

    times = asyncio.run(play())
    assert times[0.0] < 0.5 < times[1.0]


def test_tool_timeout_ends_the_episode_with_a_named_status(tokenizer):
    reply = '<tool_call>{"name": "wait", "arguments": {}}</tool_call><|im_end|>'
    agent = Agent(
        ScriptedEngine([ids(tokenizer, reply)]),
        tokenizer,
        parser="hermes",
        limits=AgentLimits(tool_timeout=0.2),
    )
    trajectories = agent.run([SlowTools(), SlowTools()], [{"delay": 5.0}, {"delay": 0.0}])
    assert [t.status for t in trajectories] == ["tool_timeout", "env_done"]
    assert "0.2 s" in trajectories[0].error


def test_requests_queued_while_the_engine_is_busy_go_out_as_one_batch(tokenizer):
    reply = ids(tokenizer, "done<|im_end|>")
    calls = []

    def slow_first_call(prompt_ids):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.5)  # the other episodes queue their requests meanwhile
        return reply

    engine = ScriptedEngine(slow_first_call)
    agent = Agent(engine, tokenizer, parser="hermes")
    trajectories = agent.run([toolgym.make("Wordle-v0") for _ in range(8)], wordle_rows(8))
    assert [t.status for t in trajectories] == ["finished"] * 8
    assert sum(engine.batches) == 8
    assert len(engine.batches) <= 2, engine.batches


def test_episodes_whose_tools_return_together_share_every_batch(tokenizer):
    """16 games of several guesses with 50 ms sync tools: one batch of 16 per turn, and the
    tools of all 16 episodes run at once (not a few at a time on a small thread pool)."""

    class SlowWordle(Wordle):
        def guess(self, word: str) -> str:
            """Guess the secret word.

            Args:
                word: A five-letter English word.
            """
            time.sleep(0.05)
            return super().guess(word)

    replies = [GUESS.format(word=w) for w in ("slate", "moist", "crane")]

    def next_guess(prompt_ids: list[int]) -> list[int]:
        turn = tokenizer.decode(prompt_ids).count("</tool_call><|im_end|>")
        return ids(tokenizer, replies[turn])

    engine = ScriptedEngine(next_guess)
    # a batch leaves once all 16 wait (or after 0.5 s): scheduling jitter on a loaded machine
    # cannot split a turn's batch, and the tool-time bound below still shows the overlap
    agent = Agent(engine, tokenizer, parser="hermes", batch_wait=0.5)
    rows = [{**row, "answer": "crane"} for row in wordle_rows(16)]
    trajectories = agent.run([SlowWordle() for _ in rows], rows)
    assert [t.status for t in trajectories] == ["env_done"] * 16
    turns = int(trajectories[0].metrics["turns"])
    assert turns >= 2 and {t.metrics["turns"] for t in trajectories} == {turns}
    assert engine.batches == [16] * turns
    assert max(t.metrics["tool_seconds"] for t in trajectories) < 0.05 * turns + 0.2


def test_reset_failure_and_engine_failure_are_statuses(tokenizer):
    class Broken(toolgym.Environment):
        def reset(self) -> str | None:
            raise RuntimeError("database down")

    def failing(prompt_ids):
        raise ConnectionError("engine gone")

    agent = scripted_agent(tokenizer, ["hi<|im_end|>"])
    (broken,) = agent.run([Broken()], [{"prompt": "hi"}])
    assert (broken.status, broken.error) == ("env_error", "RuntimeError: database down")
    agent = Agent(ScriptedEngine(failing), tokenizer, parser="hermes")
    (gone,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert gone.status == "engine_error" and "engine gone" in gone.error
    assert gone.failed and broken.failed
    assert set(STATUSES) >= {
        "finished",
        "env_done",
        "max_turns",
        "length",
        "tool_timeout",
        "env_error",
        "engine_error",
    }


def test_episode_metrics_are_read_at_the_end_and_bad_ones_are_env_errors(tokenizer):
    agent = scripted_agent(tokenizer, [GUESS.format(word="slate"), GUESS.format(word="crane")])
    (won,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert won.status == "env_done"
    assert won.env_metrics["valid_guesses"] == 2 and won.env_metrics["win"] == 1.0
    assert summarize([won])["env"]["consistent_guesses"] == 1.0

    class NotANumber(toolgym.Environment):
        def reset(self) -> None:
            self.reward = 1.0

        def episode_metrics(self) -> dict[str, float]:
            return {"progress": float("nan")}

    agent = scripted_agent(tokenizer, ["hi<|im_end|>"])
    (bad,) = agent.run([NotANumber()], [{"prompt": "hi"}])
    assert (bad.status, bad.reward) == ("env_error", 0.0)
    assert bad.error.startswith("episode_metrics failed") and "finite" in bad.error


def test_messages_are_reported_as_they_join_the_conversation(tokenizer):
    agent = scripted_agent(tokenizer, [GUESS.format(word="slate"), GUESS.format(word="crane")])
    seen, ended = [], []
    trajectories = agent.run(
        [toolgym.make("Wordle-v0"), toolgym.make("Wordle-v0")],
        wordle_rows(2),
        on_episode_end=ended.append,
        on_message=lambda index, message: seen.append((index, message, len(ended))),
    )
    for index, trajectory in enumerate(trajectories):
        mine = [(message, done) for i, message, done in seen if i == index]
        assert [message for message, _ in mine] == trajectory.messages  # each once, in order
        assert [m["role"] for m, _ in mine][:3] == ["user", "assistant", "tool"]
        assert mine[1][1] == 0  # the first turn was told before any episode ended


def test_jsonl_round_trip(tokenizer, tmp_path):
    agent = scripted_agent(tokenizer, [GUESS.format(word="crane")])
    trajectories = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    save_jsonl(trajectories, tmp_path / "t.jsonl")
    assert load_jsonl(tmp_path / "t.jsonl") == trajectories


@pytest.fixture(scope="module")
def tool_calling_model(tokenizer):
    return train_tool_caller(tokenizer)


def test_hf_engine_plays_wordle_end_to_end_token_exact(tokenizer, tool_calling_model):
    agent = greedy_agent(HFEngine(tool_calling_model, tokenizer), tokenizer)
    trajectories = play_wordle_token_exact(agent, episodes=3)
    assert any(t.reward == 1.0 for t in trajectories)


def test_hf_engine_sampling_logprobs_match_the_model(tokenizer, tool_calling_model):
    engine = HFEngine(tool_calling_model, tokenizer)
    agent = Agent(
        engine,
        tokenizer,
        parser="hermes",
        sampling=SamplingParams(temperature=1.0),
        limits=AgentLimits(max_turns=1, max_new_tokens=12),
    )
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    sequence = torch.tensor([trajectory.prompt_ids + trajectory.completion_ids])
    with torch.no_grad():
        logits = tool_calling_model(sequence).logits[0, len(trajectory.prompt_ids) - 1 : -1]
    expected = (
        logits.log_softmax(-1)
        .gather(-1, torch.tensor(trajectory.completion_ids)[:, None])
        .squeeze(-1)
    )
    assert torch.allclose(torch.tensor(trajectory.logprobs), expected, atol=1e-4)


def test_hf_engine_update_weights_loads_another_models_weights(tokenizer):
    from toolgym.testing import tiny_model

    target, source = tiny_model(tokenizer, seed=0), tiny_model(tokenizer, seed=1)
    engine = HFEngine(target, tokenizer)
    engine.update_weights(target)  # the policy itself: nothing to copy
    assert not torch.equal(target.lm_head.weight, source.lm_head.weight)
    engine.update_weights(source)
    assert all(
        torch.equal(a, b) for a, b in zip(target.parameters(), source.parameters(), strict=True)
    )


# Template families beyond toolgym's own: Qwen3-Coder's XML (prefix-preserving), Qwen3 with
# reasoning (its own template rewrites earlier turns: toolgym's Qwen3 training template is used),
# Functionary v3.1 (a call turn ends with <|eom_id|>, not the end-of-turn), and Gemma 4 (not
# prefix-preserving for text beside a call: one sample per turn; a call turn ends with
# <|tool_response>). All are real templates.
FAMILIES = {
    "chatml": (None, GUESS),
    "xml": (
        "llama.cpp/Qwen3-Coder",
        "<tool_call>\n<function=guess>\n<parameter=word>\n{word}\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>",
    ),
    "qwen3": ("trl/qwen3", "<think>\nTry {word}.\n</think>\n\n" + GUESS),
    "functionary": (
        "llama.cpp/meetkai-functionary-medium-v3.1",
        '<function=guess>{{"word": "{word}"}}</function><|eom_id|>',
    ),
    "gemma4": (
        "trl/gemma4",
        '<|channel>thought\nTry {word}.<channel|><|tool_call>call:guess{{word:<|"|>{word}<|"|>}}'
        "<tool_call|><|tool_response>",
    ),
}


def _family_tokenizer(family: str):
    from template_corpus import TEMPLATE_DIR, template_tokenizer

    path = FAMILIES[family][0]
    return tiny_tokenizer() if path is None else template_tokenizer(TEMPLATE_DIR / f"{path}.jinja")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_wordle_episodes_are_token_exact_for_real_template_families(family):
    tokenizer = _family_tokenizer(family)
    replies = [FAMILIES[family][1].format(word=w) for w in ("slate", "crane")]
    agent = Agent(ScriptedEngine([ids(tokenizer, r) for r in replies]), tokenizer, parser="auto")
    tools = toolgym.make("Wordle-v0").tools
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "env_done" and trajectory.reward == 1.0, trajectory.error
    assert trajectory.metrics["tool_calls"] == 2 and trajectory.metrics["parse_failures"] == 0
    assert agent.renderer.profile.per_turn is (family == "gemma4")
    assert agent.renderer.profile.training_template == ("qwen3" if family == "qwen3" else None)
    assistant_at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    if not agent.renderer.profile.per_turn:
        # One sequence: the first reply, the template's suffix, the second reply; and the
        # sequence up to the second turn is what the template renders for the conversation.
        first = ids(tokenizer, replies[0])
        assert trajectory.completion_ids[: len(first)] == first
        upto = trajectory.prompt_ids + trajectory.completion_ids[: -len(ids(tokenizer, replies[1]))]
        rendered = agent.renderer.render(trajectory.messages[: assistant_at[1]], tools, True)
        assert tokenizer.decode(upto) == rendered
        assert sum(trajectory.loss_mask) == len(first) + len(ids(tokenizer, replies[1]))
        if family == "chatml":
            assert_token_exact(agent, trajectory, tools)
        return
    # One sample per turn: its prompt is the template's rendering of the conversation before
    # the turn, its completion exactly the ids the model sampled (through <|tool_response>).
    assert len(trajectory.samples) == 2
    assert agent.renderer.profile.call_end == "<|tool_response>"
    for turn, at, sampled in zip(trajectory.samples, assistant_at, replies, strict=True):
        assert turn.prompt_ids == agent.renderer.prompt_ids(trajectory.messages[:at], tools)
        assert turn.completion_ids == ids(tokenizer, sampled)
        assert turn.loss_mask == [1] * len(turn.completion_ids)
    assert trajectory.messages[1]["reasoning_content"] == "Try slate."
    assert "Guess 1/6" in tokenizer.decode(trajectory.samples[1].prompt_ids)
    assert [sum(s.loss_mask) for s in trajectory.samples] == [
        len(ids(tokenizer, r)) for r in replies
    ]


def test_a_turn_that_never_started_leaves_no_empty_sample(tokenizer):
    """Per-turn episodes: when the token budget ends the episode at the next turn's prompt,
    that prompt is not a sample (nothing was sampled after it), but its tool results count
    as observation tokens."""
    replies = [GUESS.format(word="slate"), GUESS.format(word="crane")]
    first = len(ids(tokenizer, replies[0]))
    engine = ScriptedEngine([ids(tokenizer, r) for r in replies], tokenizer=tokenizer)
    limits = AgentLimits(max_episode_tokens=first + 5)
    agent = Agent(engine, tokenizer, parser="hermes", per_turn=True, limits=limits)
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "length" and len(trajectory.samples) == 1
    assert trajectory.loss_mask == [1] * first and trajectory.model_tokens == first
    assert trajectory.metrics["observation_tokens"] > 5  # the first guess's result


def test_glm_turns_end_where_the_next_turn_opens():
    """GLM's template closes no turn: the model stops on <|observation|> before tool results
    and on <|user|> after a final answer. Both are stop tokens; the tool results follow the
    <|observation|> it wrote (not a second one), and a final answer keeps no <|user|>."""
    from template_corpus import TEMPLATE_DIR, template_tokenizer

    tokenizer = template_tokenizer(TEMPLATE_DIR / "trl" / "glm4moe.jinja")
    call = (
        "\n<think></think>\n<tool_call>guess\n<arg_key>word</arg_key>\n<arg_value>slate"
        "</arg_value>\n</tool_call><|observation|>"
    )
    answer = "\n<think></think>\nI give up.<|user|>"
    engine = ScriptedEngine([ids(tokenizer, call), ids(tokenizer, answer)])
    agent = Agent(engine, tokenizer, parser="auto")
    assert agent.renderer.profile.end_opens_next_turn and not agent.renderer.profile.per_turn
    tools = toolgym.make("Wordle-v0").tools
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    assert trajectory.status == "finished" and trajectory.messages[-1]["content"] == "I give up."
    upto = trajectory.prompt_ids + trajectory.completion_ids[: -len(ids(tokenizer, answer))]
    rendered = agent.renderer.render(trajectory.messages[:-1], tools, add_generation_prompt=True)
    assert tokenizer.decode(upto) == rendered
    assert tokenizer.decode(upto).count("<|observation|>") == 1


class Undecodable(toolgym.Environment):
    def reset(self) -> str | None:
        return "Look at \udcfe this."

    def look(self) -> str:
        """Show bytes that are not UTF-8, as a program's output can be."""
        self.done = True
        return bytes([0xFF, 0x41]).decode("utf-8", "surrogateescape")


def test_undecodable_tool_output_is_escaped_and_the_samples_save(tokenizer, tmp_path):
    """A lone surrogate in a tool result or an observation becomes an escape: the template
    renders, the episode ends normally and its samples are written."""
    reply = '<tool_call>{"name": "look", "arguments": {}}</tool_call><|im_end|>'
    agent = Agent(ScriptedEngine([ids(tokenizer, reply)]), tokenizer, parser="hermes")
    (trajectory,) = agent.run([Undecodable()], [{"prompt": "go"}])
    assert trajectory.status == "env_done", trajectory.error
    assert trajectory.messages[-1]["content"] == "\\udcffA"
    assert "\\udcfe" in trajectory.messages[0]["content"]
    save_jsonl([trajectory], tmp_path / "samples.jsonl")
    assert load_jsonl(tmp_path / "samples.jsonl")[0].messages == trajectory.messages


def test_concurrent_runs_keep_their_own_sampling(tokenizer):
    """An evaluation's greedy settings are passed to its run only: training rollouts in flight
    at the same time (GRPO's producer thread with max_staleness > 0) keep their temperature,
    and the agent's own settings are never swapped."""
    import asyncio

    from toolgym.agents import SamplingParams

    seen: dict[str, set[float]] = {}

    def record(prompt_ids):
        text = tokenizer.decode(prompt_ids)
        kind = "eval" if "EVAL" in text else "train"
        seen.setdefault(kind, set()).add(record.temperature)
        return ids(tokenizer, "done<|im_end|>")

    class Recording(ScriptedEngine):
        def generate(self, requests):
            completions = []
            for request in requests:
                record.temperature = request.sampling.temperature
                completions.extend(super().generate([request]))
            return completions

    engine = Recording(record)
    agent = Agent(engine, tokenizer, parser="hermes", sampling=SamplingParams(temperature=0.7))

    async def both():
        train = agent.arun([Wordle() for _ in range(8)], [{"prompt": "TRAIN"}] * 8)
        greedy = SamplingParams(temperature=0.0)
        evaluation = agent.arun(
            [Wordle() for _ in range(8)], [{"prompt": "EVAL"}] * 8, sampling=greedy
        )
        return await asyncio.gather(train, evaluation)

    asyncio.run(both())
    assert seen == {"train": {0.7}, "eval": {0.0}}
    assert agent.sampling.temperature == 0.7


def test_engines_declare_what_they_can_do():
    """The scheduler and the trainer read `capabilities` (issue 25 item 6), not engine
    classes; an engine of a user's that declares none is judged by its methods."""
    from concurrent.futures import Future

    from toolgym.agents import HFEngine, VLLMEngine, VLLMServerEngine
    from toolgym.agents.engines import EngineCapabilities, capabilities

    assert capabilities(ScriptedEngine([[1]])) == EngineCapabilities()
    assert HFEngine.capabilities == EngineCapabilities(own_weights=False, update_with="model")
    assert VLLMEngine.capabilities.per_request and VLLMServerEngine.capabilities.per_request

    class Submits(ScriptedEngine):
        def submit(self, request):
            future = Future()
            future.set_result(self.generate([request])[0])
            return future

    assert capabilities(Submits([[1]])).per_request
