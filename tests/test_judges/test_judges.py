"""Judges (issue 47 item 1): a reward a model gives, against a rubric, one episode at a time or
a group's episodes in one call; bounded in concurrency and time, cached, and a failure that is
the judge's, never the policy's (`judge_error`, out of the loss). Checked with a scripted judge,
through toolgym's own OpenAI-compatible endpoint with the `openai` client, in a GRPO step, in
the viewer, and with a real local model (the embedded SmolLM2)."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest
from helpers import ids, tiny_grpo_args, trained_step

import toolgym
from toolgym.agents import ScriptedEngine, Trajectory
from toolgym.judges import (
    Criterion,
    EngineClient,
    Judge,
    JudgeUnparseable,
    Rubric,
    transcript,
)
from toolgym.testing import tiny_tokenizer

RUBRIC = Rubric(
    (
        Criterion("correct", "The city named is the capital asked for.", weight=3),
        Criterion("brief", "One short sentence."),
    )
)


class Scripted:
    """A judge model that answers by a function of the chat; counts calls and concurrency."""

    def __init__(self, answer, delay: float = 0.0) -> None:
        self.answer, self.delay, self.name = answer, delay, "scripted"
        self.calls, self.live, self.most_live = 0, 0, 0
        self.lock = threading.Lock()  # batches may be judged from several threads

    async def complete(self, messages):
        with self.lock:
            self.calls += 1
            self.live += 1
            self.most_live = max(self.most_live, self.live)
        try:
            await asyncio.sleep(self.delay)
            return self.answer(messages)
        finally:
            with self.lock:
                self.live -= 1


def episode(answer: str, task: str = "What is the capital of France?") -> Trajectory:
    messages = [
        {"role": "user", "content": task},
        {"role": "assistant", "content": answer},
    ]
    return Trajectory(messages=messages)


def fenced(text: str) -> list[str]:
    """The fenced parts of a judge's chat, in order (the task, then each episode)."""
    return [m.group(2) for m in re.finditer(r"<(work-[0-9a-f]{16})>\n(.*?)\n</\1>", text, re.S)]


def graded(messages) -> str:
    """Scores by what the judged episode says: Paris is right."""
    right = "Paris" in fenced(messages[-1]["content"])[1]
    return f"correct: {10 if right else 0}\nbrief: 8"


def test_a_rubric_reads_each_criterion_and_weighs_them():
    assert RUBRIC.parse_pointwise("**correct**: 10\n- brief = 5\nthanks") == {
        "correct": 10.0,
        "brief": 5.0,
    }
    assert RUBRIC.total({"correct": 10.0, "brief": 5.0}) == pytest.approx((30 + 5) / 4 / 10)
    assert RUBRIC.parse_group("Episode 2: 4\nepisode 1: 10.0", 2) == [1.0, 0.4]
    with pytest.raises(JudgeUnparseable, match="no score for brief"):
        RUBRIC.parse_pointwise("correct: 9")
    with pytest.raises(JudgeUnparseable, match=r"outside 0\.\.10"):
        RUBRIC.parse_pointwise("correct: 11\nbrief: 3")
    with pytest.raises(JudgeUnparseable, match="no score for episode 3"):
        RUBRIC.parse_group("episode 1: 3\nepisode 2: 4", 3)
    with pytest.raises(ValueError, match="letters, digits"):
        Criterion("two words", "x")
    with pytest.raises(ValueError, match="must differ"):
        Rubric((Criterion("a", "x"), Criterion("A", "y")))
    messages = RUBRIC.pointwise_messages("the task", "the episode", "work-x")
    assert "correct (75% of the score)" in messages[1]["content"]
    assert "exactly `name: score`" in messages[0]["content"]


def test_each_episode_is_scored_and_its_judgement_kept():
    judge = Judge(Scripted(graded), RUBRIC)
    batch = [episode("It is Paris."), episode("Lyon, I think."), episode("It is Paris.")]
    values = asyncio.run(judge(batch))
    assert values == [pytest.approx(0.95), pytest.approx(0.2), pytest.approx(0.95)]
    assert judge.calls == 2  # the same chat twice: asked once, the second from the cache
    first, cached = batch[0].judgements[0], batch[2].judgements[0]
    assert first["scores"] == {"correct": 10.0, "brief": 8.0} and not first["cached"]
    assert cached["cached"] and cached["answer"] == first["answer"]
    assert "It is Paris." in first["messages"][1]["content"]
    assert all(t.status == "finished" for t in batch)


def test_at_most_max_concurrency_calls_run_at_once():
    client = Scripted(graded, delay=0.05)
    judge = Judge(client, RUBRIC, max_concurrency=2, cache=False)
    asyncio.run(judge([episode(f"Paris {k}") for k in range(6)]))
    assert client.calls == 6 and client.most_live == 2


def test_many_calls_waiting_for_a_slot_never_starve_an_engine_judge_of_threads():
    """Waiting calls hold no thread: an engine's generate runs on the loop's thread pool (a
    few threads on a small machine), and 40 episodes wait for 2 slots."""
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([ids(tokenizer, "correct: 10\nbrief: 10<|im_end|>")])
    judge = Judge(EngineClient(engine, tokenizer), RUBRIC, max_concurrency=2, cache=False)
    values = asyncio.run(judge([episode(f"Paris {k}") for k in range(40)]))
    assert values == [1.0] * 40 and judge.calls == 40


def test_the_bound_holds_across_batches_judged_at_once():
    """Pipelined steps judge their batches on event loops of their own, in other threads."""
    client = Scripted(graded, delay=0.05)
    judge = Judge(client, RUBRIC, max_concurrency=2, cache=False)
    batches = [[episode(f"Paris {b}-{k}") for k in range(4)] for b in range(2)]
    threads = [threading.Thread(target=asyncio.run, args=(judge(b),)) for b in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.calls == 8 and client.most_live == 2
    assert all(t.judgements[0]["score"] == 0.95 for b in batches for t in b)


@pytest.mark.parametrize(
    ("client", "why"),
    [
        (Scripted(graded, delay=5.0), r"judge grader: the judge took over 0\.1 s"),
        (Scripted(lambda m: "I liked it."), "no score for correct, brief"),
        (Scripted(lambda m: 1 / 0), "the judge's client failed: ZeroDivisionError"),
    ],
    ids=["timeout", "unparseable", "client error"],
)
def test_a_judge_failure_is_the_judge_s_and_leaves_the_episode_out(client, why):
    judge = Judge(client, RUBRIC, name="grader", timeout=0.1)
    batch = [episode("Paris"), Trajectory(messages=episode("x").messages, status="env_error")]
    logged = {}
    assert asyncio.run(judge(batch, log_metric=logged.__setitem__)) == [None, None]
    assert batch[0].status == "judge_error" and re.search(why, batch[0].error)
    assert batch[0].failed  # out of the baselines and the loss
    assert batch[1].status == "env_error"  # an earlier infrastructure failure is kept
    assert batch[0].judgements[0]["error"] == batch[0].error
    assert logged["judge/grader/failures"] == 2.0


def test_a_group_is_judged_in_one_call_each_against_the_others():
    def ranked(messages) -> str:
        shown = fenced(messages[1]["content"])[1:]  # the task first
        return "\n".join(
            f"episode {k}: {10 if 'Paris' in text else 2}" for k, text in enumerate(shown, 1)
        )

    client = Scripted(ranked)
    judge = Judge(client, RUBRIC, mode="group")
    germany = "What is the capital of Germany?"
    batch = [
        episode("Paris"),
        episode("Nice"),
        episode("Berlin", germany),
        episode("Paris", germany),
    ]
    assert asyncio.run(judge(batch)) == [1.0, 0.2, 0.2, 1.0]
    assert client.calls == 2  # one call per task's run of episodes
    assert [t.judgements[0]["position"] for t in batch] == [1, 2, 1, 2]
    assert "Compare the 2 episodes" in batch[0].judgements[0]["messages"][0]["content"]
    assert batch[0].judgements[0]["messages"] == batch[1].judgements[0]["messages"]


def test_the_transcript_shows_calls_results_and_keeps_the_end():
    trajectory = Trajectory(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "lookup", "arguments": {"q": "France"}}}],
            },
            {"role": "tool", "name": "lookup", "content": "Paris"},
            {"role": "assistant", "content": "Paris."},
        ]
    )
    task, shown = transcript(trajectory)
    assert task == "Be brief.\n\nCapital of France?"
    assert shown.splitlines() == [
        "[assistant]",
        '[tool call] lookup({"q": "France"})',
        "[tool result of lookup] Paris",
        "[assistant] Paris.",
    ]
    _, cut = transcript(trajectory, limit=20)
    assert cut.endswith("[assistant] Paris.") and cut.startswith("[... the episode's start")


def test_an_engine_judge_renders_the_chat_with_its_template():
    tokenizer = tiny_tokenizer()
    seen = []

    def reply(prompt_ids):
        seen.append(tokenizer.decode(prompt_ids))
        return ids(tokenizer, "correct: 10\nbrief: 10<|im_end|>")

    client = EngineClient(ScriptedEngine(reply), tokenizer, name="tiny")
    judge = Judge(client, RUBRIC)
    assert asyncio.run(judge([episode("Paris")])) == [1.0]
    assert seen[0].startswith("<|im_start|>system\nYou grade") and seen[0].endswith(
        "<|im_start|>assistant\n"
    )
    assert episode("Paris").judgements == [] and judge.calls == 1


def test_an_openai_compatible_judge_answers_through_a_real_server():
    """`OpenAIClient` with the `openai` package against toolgym's own OpenAI-compatible
    endpoint (a real HTTP server on loopback) over a scripted model."""
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from toolgym.agents.endpoint import Endpoint
    from toolgym.judges import OpenAIClient

    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([ids(tokenizer, "correct: 7\nbrief: 3<|im_end|>")])
    with Endpoint(engine, tokenizer, parser="hermes") as endpoint:
        key = endpoint.open_session(temperature=0.0)
        client = OpenAIClient(endpoint.base_url, "tiny", api_key=key)
        judge = Judge(client, RUBRIC)
        (value,) = asyncio.run(judge([episode("Paris")]))
    assert value == pytest.approx((3 * 7 + 3) / 4 / 10)


class Capital(toolgym.Environment):
    """Name a country's capital; no reward of its own (the judge gives it)."""

    def reset(self, country: str = "France", **row) -> str:
        return f"What is the capital of {country}?"


def test_a_grpo_step_trains_on_the_judge_s_reward_and_leaves_its_failures_out(tmp_path):
    from toolgym.algorithms import GRPOTrainer
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    answers = ["Paris.", "Lyon.", "Paris!", "PARSE-FAIL"]
    engine = ScriptedEngine([ids(tokenizer, a + "<|im_end|>") for a in answers])
    engine.update_weights = lambda *args, **kwargs: None

    def answer(messages) -> str:
        shown = messages[1]["content"].split("Criteria:")[0]
        if "PARSE-FAIL" in shown:
            return "no idea"
        return f"correct: {10 if 'Paris' in shown else 0}\nbrief: 10"

    judge = Judge(Scripted(answer), RUBRIC, name="capitals")
    args = tiny_grpo_args(
        tmp_path, num_generations=4, micro_batch_size=4, limits={"max_turns": 1}, env_reward=False
    )
    trainer = GRPOTrainer(
        tiny_model(tokenizer),
        Capital,
        [{"prompt": "", "country": "France"}],
        reward_funcs=[judge],
        args=args,
        tokenizer=tokenizer,
        engine=engine,
    )
    metrics, saved = trained_step(trainer, tmp_path)
    assert [t.status for t in saved] == ["finished"] * 3 + ["judge_error"]
    assert [t.reward_sources.get("capitals") for t in saved[:3]] == [1.0, 0.25, 1.0]
    assert saved[3].judgements[0]["error"].startswith("judge capitals: no score")
    assert metrics["judge/capitals/failures"] == 1.0 and metrics["excluded"] == 1

    from toolgym.viewer import start

    with start(tmp_path) as viewer:
        import urllib.request

        url = f"{viewer.url}api/episode?source=samples.jsonl&index=0"
        shown = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert shown["episode"]["judgements"][0]["scores"] == {"correct": 10.0, "brief": 10.0}


@pytest.mark.slow
def test_a_real_local_model_judges_or_fails_by_name():
    """The embedded SmolLM2-135M as the judge: whatever its bits write, each episode gets a
    score in [0, 1] or a named judge failure, and nothing else."""
    from toolgym.agents import HFEngine
    from toolgym.agents.models import load_model, load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    engine = HFEngine(load_model("smollm2-135m"), tokenizer)
    judge = Judge(EngineClient(engine, tokenizer, max_tokens=48), Rubric(), timeout=120)
    batch = [episode("Paris."), episode("Berlin.")]
    values = asyncio.run(judge(batch))
    for value, trajectory in zip(values, batch, strict=True):
        if value is None:
            assert trajectory.status == "judge_error" and "judge judge:" in trajectory.error
        else:
            assert 0.0 <= value <= 1.0 and trajectory.status == "finished"
        assert trajectory.judgements[0]["answer"] or trajectory.judgements[0]["error"]
    assert judge.calls == 2
