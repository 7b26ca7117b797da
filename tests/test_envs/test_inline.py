"""Inline episodes: generation stops at the environment's markers, its observations go into the
same assistant turn as unsampled tokens, and the whole sequence decodes to what the model saw."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import inline_agent
from sandbox_envs import InlineCalculator
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

import toolgym
from toolgym.agents import Agent, AgentLimits, HFEngine, ScriptedEngine
from toolgym.agents.engines.base import GenerationRequest, SamplingParams
from toolgym.agents.inline import observation_ids
from toolgym.agents.trajectory import load_jsonl
from toolgym.builtin_envs.python_lines import PythonLines
from toolgym.sandbox import sandboxed
from toolgym.testing import tiny_model, tiny_tokenizer


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def play(agent: Agent, env=None):
    env = env or InlineCalculator()
    (trajectory,) = agent.run([env], [{"prompt": "What is 6*7?"}])
    return trajectory, env


def test_observations_are_appended_inline_and_the_sequence_decodes_to_what_the_model_saw():
    tokenizer = tiny_tokenizer()
    replies = [
        "Let me compute <code>6*7</code> and then some text the marker cut",  # cut at the marker
        "So <code>1/0</code>",
        "The answer is 42.<|im_end|>",
    ]
    trajectory, env = play(inline_agent(tokenizer, replies))
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    assert env.seen == ["Let me compute <code>6*7</code>", "So <code>1/0</code>"]
    assert env.answer == "The answer is 42."
    text = tokenizer.decode(trajectory.completion_ids, skip_special_tokens=False)
    assert text == (
        "Let me compute <code>6*7</code><output>42</output>So <code>1/0</code>"
        "<output>ZeroDivisionError</output>The answer is 42.<|im_end|>"
    )
    observed = [
        tokenizer.decode(
            [
                t
                for t, m in zip(trajectory.completion_ids, trajectory.loss_mask, strict=True)
                if not m
            ]
        )
    ]
    assert observed == ["<output>42</output><output>ZeroDivisionError</output>"]
    assert trajectory.loss_mask[-1] == 1 and trajectory.logprobs[-1] == 0.0
    ends = [r["end"] for r in trajectory.step_rewards]
    assert [r["reward"] for r in trajectory.step_rewards] == [0.1, -0.3]
    first = tokenizer.decode(trajectory.completion_ids[: ends[0]])
    assert first == "Let me compute <code>6*7</code>"  # the reward follows the model's span
    assert trajectory.metrics["tool_calls"] == 2 and trajectory.metrics["tool_failures"] == 1
    assert trajectory.metrics["turns"] == 3 and trajectory.metrics["inexact_observations"] == 0
    (message,) = [m for m in trajectory.messages if m["role"] == "assistant"]
    assert message["content"] == text


def test_the_environment_ending_the_episode_and_the_limits_give_their_statuses():
    tokenizer = tiny_tokenizer()
    trajectory, _ = play(inline_agent(tokenizer, ["<code>stop</code> more"]))
    assert trajectory.status == "env_done"
    assert tokenizer.decode(trajectory.completion_ids).endswith("<output>bye</output>")
    endless = inline_agent(tokenizer, ["<code>1+1</code>"], max_turns=3)
    trajectory, env = play(endless)
    assert trajectory.status == "max_turns" and len(env.seen) == 3
    short = inline_agent(tokenizer, ["<code>1+1</code>"], max_episode_tokens=30)
    trajectory, _ = play(short)
    assert trajectory.status == "length"


def test_a_hanging_or_crashing_inline_step_ends_only_its_own_episode():
    class Hangs(InlineCalculator):
        def inline_step(self, text):
            import time

            time.sleep(5)

    class Crashes(InlineCalculator):
        def inline_step(self, text):
            raise RuntimeError("the interpreter died")

    tokenizer = tiny_tokenizer()
    agent = inline_agent(tokenizer, ["<code>1</code>"], tool_timeout=0.2)
    rows = [{"prompt": "x"}] * 3
    hung, crashed, fine = agent.run([Hangs(), Crashes(), InlineCalculator()], rows)
    assert hung.status == "tool_timeout" and "inline_step took over 0.2 s" in hung.error
    # raised on the model's text: the model's failure (issue 43), unless marked EnvironmentBug
    assert crashed.status == "tool_crash" and "the interpreter died" in crashed.error
    assert fine.status == "max_turns"


def test_an_inline_environment_in_a_process_sandbox_answers_the_same():
    tokenizer = tiny_tokenizer()
    replies = ["I try <code>2**10</code>", "Done: 42<|im_end|>"]
    local, _ = play(inline_agent(tokenizer, replies))
    env = sandboxed(InlineCalculator, where="process")
    try:
        sandboxed_run, _ = play(inline_agent(tokenizer, replies), env)
    finally:
        env.close()
    assert sandboxed_run.status == local.status == "finished" and sandboxed_run.reward == 1.0
    assert sandboxed_run.completion_ids == local.completion_ids
    assert sandboxed_run.loss_mask == local.loss_mask
    assert "<output>1024</output>" in tokenizer.decode(sandboxed_run.completion_ids)


def sentencepiece_like_tokenizer():
    """A word-start-marking tokenizer (SentencePiece's "▁" scheme, built offline): encoding a
    text on its own adds a word start that decoding after other tokens turns into a space."""
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1}
    for piece in [
        "▁",
        "<",
        ">",
        "/",
        "o",
        "u",
        "t",
        "p",
        "c",
        "d",
        "e",
        "1",
        "2",
        "=",
        "▁x",
        "x",
        "\n",
    ]:
        vocab.setdefault(piece, len(vocab))
    model = models.WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix="")
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>")


def test_observation_ids_decode_exactly_after_the_model_tokens():
    byte_level = tiny_tokenizer()
    before = ids(byte_level, "x = <code>1</code>")
    obs, exact = observation_ids(byte_level, before, "<output>2</output>")
    assert exact and obs == ids(byte_level, "<output>2</output>")
    word_start = sentencepiece_like_tokenizer()
    before = ids(word_start, "x=<code>1</code>")
    naive = ids(word_start, "<output>2</output>")
    assert word_start.decode(before + naive) != word_start.decode(before) + "<output>2</output>"
    obs, exact = observation_ids(word_start, before, "<output>2</output>")
    assert exact
    assert word_start.decode(before + obs) == word_start.decode(before) + "<output>2</output>"


def test_hf_engine_stops_after_the_token_that_completes_a_stop_string():
    """Sampling with the same seed with and without a stop string: the stopped completion is
    the free one cut after the first token whose prefix contains the marker."""
    tokenizer = tiny_tokenizer()
    engine = HFEngine(tiny_model(tokenizer, seed=5), tokenizer)
    prompt = ids(tokenizer, "<|im_start|>user\nMultiply 4821 and 9384.<|im_end|>\n")

    def sample(stop_strings: list[str]):
        torch.manual_seed(0)
        request = GenerationRequest(prompt, SamplingParams(32, stop_strings=stop_strings))
        return engine.generate([request])[0]

    free = sample([])
    prefixes = [tokenizer.decode(free.token_ids[:n]) for n in range(len(free.token_ids) + 1)]
    marker = prefixes[12][-2:]  # two characters the free completion writes mid-way
    expected = next(n for n, text in enumerate(prefixes) if marker in text)
    stopped = sample([marker, "never-there"])
    assert stopped.finish_reason == "stop" and 0 < expected < len(free.token_ids)
    assert stopped.token_ids == free.token_ids[:expected]
    assert stopped.logprobs == pytest.approx(free.logprobs[:expected])


@pytest.mark.parametrize("where", ["local", "process"])
def test_python_lines_runs_each_statement_as_its_line_ends(where):
    """The REPL in line mode, played by a scripted model: output appears inline after each
    line, a block waits for its empty line, a raising line is penalised, submit ends it."""
    tokenizer = tiny_tokenizer()
    lines = [
        "# 12 boxes of 30 apples, 7 sold\n",
        "total = 12 * 30\n",
        "print(total)\n",
        "for i in range(2):\n",
        "    print(i)\n",
        "\n",
        "total / 0\n",
        "submit(total - 7)\n",
    ]
    env = sandboxed(PythonLines, where=where)
    try:
        agent = inline_agent(tokenizer, lines, max_turns=12)
        row = {"task": "How many apples?", "answer": "353"}
        (trajectory,) = agent.run([env], [row])
    finally:
        env.close()
    assert trajectory.status == "env_done" and trajectory.reward == 1.0
    text = tokenizer.decode(trajectory.completion_ids, skip_special_tokens=False)
    assert text == (
        "# 12 boxes of 30 apples, 7 sold\ntotal = 12 * 30\nprint(total)\n360\n"
        "for i in range(2):\n    print(i)\n\n0\n1\n"
        "total / 0\nZeroDivisionError: division by zero\nsubmit(total - 7)\nsubmitted 353\n"
    )
    rewards = [r["reward"] for r in trajectory.step_rewards]
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.3, 0.0]
    assert trajectory.metrics["tool_calls"] == 8 and trajectory.metrics["tool_failures"] == 1
    observed = [
        t for t, m in zip(trajectory.completion_ids, trajectory.loss_mask, strict=True) if not m
    ]
    assert (
        tokenizer.decode(observed)
        == "360\n0\n1\nZeroDivisionError: division by zero\nsubmitted 353\n"
    )
    assert "run" not in tokenizer.decode(trajectory.prompt_ids)  # no tools in an inline prompt


def test_step_rewards_credit_the_tokens_of_their_span():
    from toolgym.agents.trajectory import Sample, Trajectory
    from toolgym.algorithms import collate, policy_loss, training_samples
    from toolgym.algorithms.losses import StepNormalizer
    from toolgym.algorithms.rewards import step_reward_bonus, step_reward_total

    trajectory = Trajectory([Sample([1, 2])])
    trajectory.append([10, 11, 12], sampled=True, logprobs=[-1.0] * 3)  # step 1: reward -0.3
    trajectory.append([50, 51], sampled=False)
    trajectory.append([13, 14], sampled=True, logprobs=[-1.0] * 2)  # step 2: reward 0.5
    trajectory.append([52], sampled=False)
    trajectory.append([15], sampled=True, logprobs=[-1.0])  # the end of the turn: no step
    trajectory.step_rewards = [{"end": 3, "reward": -0.3}, {"end": 7, "reward": 0.5}]
    bonus = step_reward_bonus(trajectory)
    assert bonus == [-0.3, -0.3, -0.3, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0]  # masks keep observations out
    assert step_reward_total(trajectory) == pytest.approx(0.2)
    credited = collate(training_samples([trajectory], [1.0], step_credit=True), pad_id=0)
    assert credited.episode_tokens.tolist() == [6.0]
    plain = collate(training_samples([trajectory], [1.0]), pad_id=0)
    assert torch.equal(plain.token_advantages, torch.ones_like(plain.token_advantages))
    # position 2 + k of the sequence is completion token k
    assert credited.token_advantages[0, 2:].tolist() == pytest.approx([1 + b for b in bonus])
    mask, _, tokens = credited.targets()
    logprobs = torch.zeros_like(mask, requires_grad=True)
    normalizer = StepNormalizer(sequences=1, tokens=float(tokens), micro_batches=1, max_tokens=16)
    loss, _ = policy_loss(
        logprobs, logprobs.detach(), credited.token_advantages[:, 1:], mask, normalizer
    )
    loss.backward()
    # dapo: -(advantage of each sampled token) / sampled tokens; observations get nothing
    expected = [
        -(1 + b) / 6 if m else 0.0 for b, m in zip(bonus, trajectory.loss_mask, strict=True)
    ]
    assert logprobs.grad[0, 1:].tolist() == pytest.approx(expected)


def train_line_writer(tokenizer, row):
    """A tiny random model fitted to one scripted PythonLines episode (a line that works, one
    that raises, a submit), so that sampling writes lines that run."""
    lines = ["x = 12 * 30\n", "x / 0\n", "submit(x)\n"]
    agent = inline_agent(tokenizer, lines)
    (script,) = agent.run([PythonLines()], [row])
    model = tiny_model(tokenizer, seed=2)
    sequence = torch.tensor([script.prompt_ids + script.completion_ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        model(sequence, labels=sequence).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["return", "tokens"])
def test_the_trainer_uses_per_step_rewards_of_a_live_repl(tmp_path, mode):
    """GRPO on PythonLines-v0 with a tiny random model: each line it writes runs (and mostly
    fails to compile, earning the error reward); the step's rewards reach the update."""
    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.builtin_envs.python_lines import python_lines_dataset

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        prompts_per_step=1,
        num_generations=3,
        micro_batch_size=3,
        limits=AgentLimits(max_turns=4, max_new_tokens=64, max_episode_tokens=400),
        progress_bar=False,
        save_steps=0,
        sandbox="local",
        step_rewards=mode,
    )
    rows = python_lines_dataset(1, seed=0)
    model = train_line_writer(tokenizer, rows[0])
    trainer = GRPOTrainer(model, "PythonLines-v0", rows, args=args, tokenizer=tokenizer)
    (metrics,) = trainer.train()
    assert math.isfinite(metrics["loss"])
    samples = load_jsonl(tmp_path / "samples.jsonl")
    assert any(t.step_rewards for t in samples), "no line was written"
    totals = [sum(s["reward"] for s in t.step_rewards) for t in samples]
    assert any(total < 0 for total in totals)
    assert [t.reward_sources["step_rewards"] for t in samples] == pytest.approx(totals)
    assert all(t.reward_sources["env"] == 0.0 for t in samples)  # the parts, in either mode
    if mode == "return":  # the environment's reward (0: nothing submitted) plus the steps'
        assert [t.reward for t in samples] == pytest.approx(totals)
    else:
        assert all(t.reward == 0.0 for t in samples)


def test_review_fixes_a_last_line_still_runs_and_broken_environments_end_one_episode():
    """A submit() the model ends its turn on counts, plain text is never graded; a NaN step
    reward ends its own episode with env_error, a final_answer that raises with tool_crash;
    a final observation that does not fit does not hide that the environment ended the
    episode."""
    env = PythonLines()
    env.reset(answer="7")
    env.final_answer("403")
    assert env.reward == 0.0 and not env.done
    env.final_answer("x = 3 + 4\nsubmit(x)")  # the block's first line runs, then...
    env.reset(answer="7")
    env.inline_step("x = 3 + 4\n")
    env.final_answer("submit(x)")  # ...a last line without its newline still runs
    assert env.reward == 1.0 and env.done
    env.close()

    class NotANumber(InlineCalculator):
        def inline_step(self, text):
            return toolgym.InlineStep("<output>?</output>", reward=float("nan"))

    class BrokenGrader(InlineCalculator):
        def final_answer(self, text):
            raise RuntimeError("the grader died")

    tokenizer = tiny_tokenizer()

    def code_then_done(prompt_ids: list[int]) -> list[int]:
        """Each episode's own script (replies handed out in turn would race between the
        two episodes: under load one of them could get "done" first)."""
        observed = "<output>" in tokenizer.decode(prompt_ids)
        return ids(tokenizer, "done<|im_end|>" if observed else "<code>1</code>")

    agent = Agent(ScriptedEngine(code_then_done, tokenizer=tokenizer), tokenizer)
    nan, broken = agent.run([NotANumber(), BrokenGrader()], [{"prompt": "x"}] * 2)
    assert nan.status == "env_error" and "not a finite number" in nan.error
    # raised on the model's answer: the model's (issue 43); `EnvironmentBug` would be env_error
    assert broken.status == "tool_crash" and "the grader died" in broken.error
    tight = inline_agent(tokenizer, ["<code>stop</code>"], max_episode_tokens=14)
    (ended,) = tight.run([InlineCalculator()], [{"prompt": "x"}])
    assert ended.status == "env_done"
    assert "bye" not in tokenizer.decode(ended.completion_ids)  # the observation did not fit
