"""A trajectory as a graph of samples: several user turns and context compaction.

`examples/sample_graph.py` holds the example environment (`ShoppingList`: a user who asks for
one item per turn, then for the list). Every shape is checked token for token against the
template's own rendering of the conversation the model saw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers import GUESS, assert_token_exact, ids, tiny_grpo_args, trained_step, wordle_rows

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine, SubAgent
from toolgym.agents.compaction import SUMMARY_PROMPT, Compaction, compact_messages
from toolgym.agents.templates import chatml_tools_template
from toolgym.algorithms import GRPOConfig
from toolgym.testing import tiny_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example():
    spec = importlib.util.spec_from_file_location("sample_graph", EXAMPLES / "sample_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sample_graph"] = module
    spec.loader.exec_module(module)
    return module


example = _example()
ShoppingList, shopping_rows = example.ShoppingList, example.shopping_rows


def add(item: str) -> str:
    call = json.dumps({"name": "add_item", "arguments": {"item": item}})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


SCRIPT = [add("milk"), "Done.<|im_end|>", add("eggs"), "Done.<|im_end|>", "milk, eggs<|im_end|>"]
"""A perfect shopping episode: two items asked for in two user turns, then the list."""
ROWS = [{**shopping_rows(1)[0], "items": ["milk", "eggs"]}]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def scripted(tokenizer, replies, chat_template=None, **options) -> Agent:
    engine = ScriptedEngine([ids(tokenizer, r) for r in replies])
    return Agent(engine, tokenizer, parser="hermes", chat_template=chat_template, **options)


def roles(trajectory) -> list[str]:
    return [m["role"] for m in trajectory.messages]


def test_user_turns_are_appended_as_the_templates_tokens_in_one_sequence(tokenizer):
    agent = scripted(tokenizer, SCRIPT)
    env = toolgym.as_environment(ShoppingList())
    (trajectory,) = agent.run([env], ROWS)
    assert trajectory.status == "finished" and trajectory.reward == 1.0, trajectory.error
    assert roles(trajectory) == [
        "system",
        "user",
        *("assistant", "tool", "assistant", "user"),
        *("assistant", "tool", "assistant", "user"),
        "assistant",
    ]
    assert trajectory.messages[5]["content"] == "Thanks. Please also add eggs."
    assert trajectory.messages[9]["content"] == "What is on my list now?"
    assert len(trajectory.samples) == 1 and trajectory.samples[0].parent is None
    assert_token_exact(agent, trajectory, env.tools)  # the user turns are the template's ids
    assert trajectory.env_metrics == {"items_on_list": 2.0, "user_turns": 3.0}
    assert trajectory.metrics["turns"] == 5


def test_per_turn_samples_chain_their_parents_over_user_turns(tokenizer):
    agent = scripted(tokenizer, SCRIPT, per_turn=True)
    env = toolgym.as_environment(ShoppingList())
    (trajectory,) = agent.run([env], ROWS)
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    assert [s.parent for s in trajectory.samples] == [None, 0, 1, 2, 3]
    assert all(s.role == "policy" for s in trajectory.samples)
    # each turn's prompt is the template's rendering of the conversation before it
    turns = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    for sample, at in zip(trajectory.samples, turns, strict=True):
        before = trajectory.messages[:at]
        assert sample.prompt_ids == agent.renderer.prompt_ids(before, env.tools)
        assert set(sample.loss_mask) == {1}


REWRITING = (
    chatml_tools_template()
    .replace(
        "{%- for message in turns -%}",
        "{%- set ns = namespace(last_user=-1) -%}"
        '{%- for m in turns -%}{%- if m.role == "user" -%}{%- set ns.last_user = loop.index0 -%}'
        "{%- endif -%}{%- endfor -%}"
        "{%- for message in turns -%}",
    )
    .replace(
        '{{- "<|im_start|>assistant\\n" + (message.content or "") -}}',
        '{{- "<|im_start|>assistant\\n" + ("(answered)" if loop.index0 < ns.last_user and '
        'not message.tool_calls else (message.content or "")) -}}',
    )
)
"""A template that writes a plain answer followed by a user turn differently ("(answered)"),
as templates that drop earlier reasoning do: prefix-preserving over tool round trips, not
over a user turn."""


def test_a_user_turn_past_a_broken_prefix_starts_a_sample_of_its_own(tokenizer):
    assert "(answered)" in REWRITING
    agent = scripted(tokenizer, SCRIPT, chat_template=REWRITING)
    assert not agent.renderer.profile.per_turn  # one sequence over tool round trips
    env = toolgym.as_environment(ShoppingList())
    (trajectory,) = agent.run([env], ROWS)
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    assert [s.parent for s in trajectory.samples] == [None, 0, 1]
    messages = trajectory.messages
    users = [i for i, m in enumerate(messages) if m["role"] == "user"][1:]
    for sample, at in zip(trajectory.samples[1:], users, strict=True):
        prompt = agent.renderer.prompt_ids(messages[: at + 1], env.tools)
        assert sample.prompt_ids == prompt
        assert "(answered)" in tokenizer.decode(sample.prompt_ids)
    # each sample goes on as one sequence until the next user turn: two turns each
    assert [sum(s.loss_mask) > 0 for s in trajectory.samples] == [True, True, True]
    assert trajectory.metrics["turns"] == 5


class BadUser(toolgym.Environment):
    def reset(self, reply: object = 7) -> str:
        self.reply = reply
        return "Say something."

    def user_turn(self, answer: str):
        if self.reply == "raise":
            raise ValueError(f"cannot answer {answer!r}")
        return self.reply


def test_a_user_turn_that_is_not_text_is_the_environments_failure(tokenizer):
    agent = scripted(tokenizer, ["Hello.<|im_end|>"])
    (trajectory,) = agent.run([toolgym.as_environment(BadUser())], [{"reply": 7}])
    assert trajectory.status == "env_error"
    assert "BadUser.user_turn returned int, not a str or None" in trajectory.error


def test_a_user_turn_that_raises_on_the_answer_is_the_models(tokenizer):
    agent = scripted(tokenizer, ["Hello.<|im_end|>"])
    (trajectory,) = agent.run([toolgym.as_environment(BadUser())], [{"reply": "raise"}])
    assert trajectory.status == "tool_crash"
    assert "user_turn" in trajectory.error and "cannot answer 'Hello.'" in trajectory.error


def test_an_environment_without_user_turns_ends_at_the_first_answer(tokenizer):
    agent = scripted(tokenizer, ["Hello.<|im_end|>"])
    (trajectory,) = agent.run([toolgym.as_environment(BadUser())], [{"reply": None}])
    assert trajectory.status == "finished" and roles(trajectory) == ["user", "assistant"]


@pytest.mark.skipif(
    os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") != "1" and shutil.which("bwrap") is None,
    reason="bubblewrap is not installed (apt-get install bubblewrap; scripts/sandbox_setup.sh)",
)
def test_user_turns_cross_a_process_sandbox(tokenizer):
    agent = scripted(tokenizer, SCRIPT)
    env = toolgym.env_factory(ShoppingList, sandbox="process")()
    try:
        (trajectory,) = agent.run([env], ROWS)
    finally:
        env.close()
    assert trajectory.status == "finished" and trajectory.reward == 1.0, trajectory.error
    assert roles(trajectory).count("user") == 3


# -- compaction ------------------------------------------------------------------------------


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for turn in range(turns):
        call = {"type": "function", "id": f"c{turn}", "function": {"name": "f", "arguments": {}}}
        messages.append({"role": "assistant", "content": f"a{turn}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": f"r{turn}"})
    return messages


def test_compact_messages_keeps_the_task_and_the_latest_turns():
    messages = conversation(4)
    kept = compact_messages(messages, keep_turns=1)
    assert kept is not None
    assert [m["content"] for m in kept] == [
        "s",
        "task\n\n[3 earlier turns removed to save space]",
        "a3",
        "r3",
    ]
    assert messages[1]["content"] == "task"  # the conversation itself is not changed
    # compacted again later: one note, counting every dropped turn
    later = kept + conversation(2)[2:]
    again = compact_messages(later, keep_turns=1)
    assert again is not None
    assert again[1]["content"] == "task\n\n[5 earlier turns removed to save space]"
    summary = compact_messages(messages, keep_turns=2, summary="tried a0 and a1")
    assert summary is not None
    assert summary[1]["content"] == "task\n\nSummary of the earlier turns:\ntried a0 and a1"
    assert [m["content"] for m in summary[2:]] == ["a2", "r2", "a3", "r3"]
    assert compact_messages(conversation(1), keep_turns=1) is None  # nothing to drop
    blocks = [{"role": "user", "content": [{"type": "text", "text": "task"}]}]
    kept = compact_messages(blocks + conversation(2)[2:], keep_turns=1)
    assert kept is not None and kept[0]["content"][-1]["type"] == "text"


def test_compaction_settings_are_checked():
    with pytest.raises(ValueError, match="max_prompt_tokens must be >= 1"):
        Compaction(0)
    with pytest.raises(ValueError, match="keep_turns must be >= 1"):
        GRPOConfig(compact_at_tokens=100, compact_keep_turns=0)
    assert GRPOConfig().compaction() is None
    assert GRPOConfig(compact_at_tokens=64).compaction() == Compaction(64)


WORDS = ("slate", "moist", "crane", "pound", "light", "brick")


def test_a_compacted_wordle_game_goes_on_in_new_samples_exactly(tokenizer):
    replies = [GUESS.format(word=w) for w in WORDS]
    agent = scripted(tokenizer, replies, compaction=Compaction(max_prompt_tokens=600))
    env = toolgym.make("Wordle-v0")
    (trajectory,) = agent.run([env], wordle_rows(1, answer="vivid"))
    assert trajectory.status == "env_done" and trajectory.metrics["turns"] == 6
    compactions = int(trajectory.metrics["compactions"])
    assert compactions >= 2 and len(trajectory.samples) == compactions + 1
    assert [s.parent for s in trajectory.samples] == [None, *range(compactions)]
    # the whole conversation is kept; each compacted sample's prompt is the template's
    # rendering of the task, a note, and the latest turn with its feedback
    assert [m["role"] for m in trajectory.messages].count("assistant") == 6
    for sample in trajectory.samples[1:]:
        text = tokenizer.decode(sample.prompt_ids)
        assert "earlier turn" in text and "removed to save space" in text
        assert text.count("<|im_start|>assistant") == 2  # the kept turn and the next one's
        parent = trajectory.samples[sample.parent]
        assert len(sample.prompt_ids) < len(parent.prompt_ids) + len(parent.completion_ids)
    assert trajectory.model_tokens == sum(len(ids(tokenizer, r)) for r in replies)


def test_the_summary_is_a_trained_sample_and_carries_into_the_next(tokenizer):
    summary = "I guessed slate and moist; no letter fits yet."

    def reply(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids)
        if text.rstrip().endswith("<|im_start|>assistant") and SUMMARY_PROMPT in text[-600:]:
            return ids(tokenizer, summary + "<|im_end|>")
        return ids(tokenizer, GUESS.format(word=WORDS[text.count("<tool_response>") % 6]))

    compaction = Compaction(max_prompt_tokens=500, summary=True)
    agent = Agent(ScriptedEngine(reply), tokenizer, parser="hermes", compaction=compaction)
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1, answer="vivid"))
    assert trajectory.metrics["compactions"] >= 1, trajectory.messages
    first_summary = next(
        i
        for i, s in enumerate(trajectory.samples)
        if i and SUMMARY_PROMPT in tokenizer.decode(s.prompt_ids)
    )
    sample = trajectory.samples[first_summary]
    assert tokenizer.decode(sample.completion_ids) == summary + "<|im_end|>"
    assert set(sample.loss_mask) == {1}  # the summary is trained
    carried = trajectory.samples[first_summary + 1]
    assert carried.parent == first_summary
    assert f"Summary of the earlier turns:\n{summary}" in tokenizer.decode(carried.prompt_ids)
    marked = [m for m in trajectory.messages if m.get("compaction") == "summary"]
    assert [m["role"] for m in marked[:2]] == ["user", "assistant"]


def test_the_episode_budget_counts_tokens_across_compacted_samples(tokenizer):
    replies = [GUESS.format(word=w) for w in WORDS]
    limits = AgentLimits(max_episode_tokens=420)
    agent = scripted(tokenizer, replies, compaction=Compaction(300), limits=limits)
    (trajectory,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1, answer="vivid"))
    assert trajectory.status == "length" and len(trajectory.samples) >= 2
    # what the episode added: sampled and observed tokens, never more than the budget
    assert trajectory.model_tokens + trajectory.observation_tokens <= 420


def shopper(tokenizer):
    """A scripted policy for `ShoppingList` that reads the conversation's last turn: it adds
    the item asked for, says so after the tool's answer, and names the items when asked."""

    def reply(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids)
        last = text.rsplit("<|im_start|>", 2)[-2]
        if last.startswith("tool"):
            return ids(tokenizer, "Done.<|im_end|>")
        if "What is on my list" in last:
            items = re.findall(r"add (\w+)", text)
            return ids(tokenizer, ", ".join(dict.fromkeys(items)) + "<|im_end|>")
        (item,) = re.findall(r"add (\w+)", last)
        return ids(tokenizer, add(item))

    return reply


@pytest.mark.timeout(300)
def test_one_grpo_step_trains_on_user_turns_and_compacted_samples(tmp_path):
    from toolgym.algorithms import GRPOTrainer
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    limits = AgentLimits(max_turns=8, max_new_tokens=64, max_episode_tokens=3000)
    args = tiny_grpo_args(tmp_path, limits=limits, compact_at_tokens=560)
    rows = shopping_rows(1, items=3)
    trainer = GRPOTrainer(
        tiny_model(tokenizer),
        ShoppingList,
        rows,
        args=args,
        tokenizer=tokenizer,
        engine=ScriptedEngine(shopper(tokenizer)),
    )
    _, trajectories = trained_step(trainer, tmp_path)
    assert len(trajectories) == 2
    for trajectory in trajectories:
        assert trajectory.status == "finished", trajectory.error
        assert roles(trajectory).count("user") == 4  # the task and three more user turns
        assert trajectory.metrics["compactions"] == 2
        # what compaction costs: the shopper added all three items, but when asked for the
        # list it sees only the task (milk) and the latest turns, and names milk alone
        assert trajectory.messages[-1]["content"] == "milk" and trajectory.reward == 0.75
        parents = [s.parent for s in trajectory.samples]
        assert parents == [None, *range(len(parents) - 1)]
    saved = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    assert saved["samples"][1]["parent"] == 0 and saved["samples"][1]["role"] == "policy"


# -- sub-agents ------------------------------------------------------------------------------


class Ask(toolgym.Environment):
    """A task the caller hands to a helper: six times seven."""

    def reset(self) -> str:
        return "What is six times seven? Ask the helper."

    def note(self, text: str) -> str:
        """Write a note.

        Args:
            text: The note.
        """
        return "noted"

    def final_answer(self, text: str) -> None:
        self.reward = float("42" in text)
        self.done = True


def delegate(task: object) -> str:
    call = json.dumps({"name": "delegate", "arguments": {"task": task}})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


def caller_and_helper(tokenizer, task: object = "Compute 6*7."):
    """The caller (its prompt lists the `delegate` tool) delegates once, then answers with
    what came back; the helper (no tools) answers 42."""

    def reply(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids)
        if '"delegate"' not in text:
            return ids(tokenizer, "42<|im_end|>")
        if "<tool_response>" in text:
            return ids(tokenizer, "The answer is 42.<|im_end|>")
        return ids(tokenizer, delegate(task))

    return reply


def test_a_subagent_call_plays_an_episode_whose_samples_join_with_their_role(tokenizer):
    agent = Agent(
        ScriptedEngine(caller_and_helper(tokenizer)),
        tokenizer,
        parser="hermes",
        subagents=[SubAgent()],
    )
    env = toolgym.as_environment(Ask())
    (trajectory,) = agent.run([env], [{}])
    assert trajectory.status == "finished" and trajectory.reward == 1.0, trajectory.error
    result = trajectory.messages[2]
    assert result["role"] == "tool" and result["content"] == "42"
    assert result["subepisode"]["role"] == "subagent"
    assert [m["content"] for m in result["subepisode"]["messages"]] == ["Compute 6*7.", "42"]
    helper, caller = trajectory.samples
    assert (helper.role, helper.parent, caller.role, caller.parent) == (
        "subagent",
        1,
        "policy",
        None,
    )
    assert tokenizer.decode(helper.completion_ids) == "42<|im_end|>" and set(helper.loss_mask) == {
        1
    }
    assert '"delegate"' not in tokenizer.decode(helper.prompt_ids)  # the helper has no tools
    tools = [*env.tools, SubAgent().schema()]
    assert_token_exact(agent, trajectory, tools)  # the last sample is still the caller's
    assert trajectory.metrics["tool_calls"] == 1
    assert trajectory.model_tokens == sum(helper.loss_mask) + sum(caller.loss_mask)


def test_a_subagent_call_without_a_task_is_refused_and_the_episode_goes_on(tokenizer):
    agent = Agent(
        ScriptedEngine(caller_and_helper(tokenizer, task=7)),
        tokenizer,
        parser="hermes",
        subagents=[SubAgent()],
    )
    (trajectory,) = agent.run([toolgym.as_environment(Ask())], [{}])
    assert trajectory.status == "finished" and len(trajectory.samples) == 1
    assert trajectory.messages[2]["content"] == "Error: delegate takes one argument, task (text)."
    assert trajectory.metrics["tool_failures"] == 1


def test_a_subagent_named_like_a_tool_of_the_environment_is_refused(tokenizer):
    agent = Agent(ScriptedEngine([]), tokenizer, parser="hermes", subagents=[SubAgent("note")])
    (trajectory,) = agent.run([toolgym.as_environment(Ask())], [{}])
    assert trajectory.status == "env_error"
    assert "sub-agent tool 'note' has the name of a tool of the environment" in trajectory.error


class BrokenReset(toolgym.Environment):
    def reset(self) -> str:
        raise RuntimeError("no world to reset")


def test_a_failing_reset_of_a_row_without_a_prompt_ends_its_episode_not_the_run(tokenizer):
    """Found while adding sub-agents: the failure's own handler needed a prompt, so a row
    without one (reset() gives the first observation) crashed `Agent.run`."""
    agent = Agent(ScriptedEngine([]), tokenizer, parser="hermes")
    (trajectory,) = agent.run([toolgym.as_environment(BrokenReset())], [{}])
    assert trajectory.status == "env_error" and "no world to reset" in trajectory.error
    assert trajectory.messages == []


@pytest.mark.timeout(300)
def test_one_grpo_step_trains_the_helpers_samples_with_the_episode(tmp_path):
    from toolgym.algorithms import GRPOTrainer
    from toolgym.algorithms.batch import training_samples
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    limits = AgentLimits(max_turns=4, max_new_tokens=64, max_episode_tokens=1500)
    args = tiny_grpo_args(tmp_path, limits=limits)
    trainer = GRPOTrainer(
        tiny_model(tokenizer),
        Ask,
        [{"prompt": "Answer the question."}],
        args=args,
        tokenizer=tokenizer,
        engine=ScriptedEngine(caller_and_helper(tokenizer)),
        subagents=[SubAgent(role="helper")],
    )
    _, trajectories = trained_step(trainer, tmp_path)
    assert [[s.role for s in t.samples] for t in trajectories] == [["helper", "policy"]] * 2
    rows = training_samples(trajectories, [0.5, -0.5])
    assert [(r.sample.role, r.advantage) for r in rows] == [
        ("helper", 0.5),
        ("policy", 0.5),
        ("helper", -0.5),
        ("policy", -0.5),
    ]


def test_a_task_of_undecodable_text_reaches_the_helper_escaped(tokenizer):
    task = "\udcff lone surrogate \ud800"
    agent = Agent(
        ScriptedEngine(caller_and_helper(tokenizer, task=task)),
        tokenizer,
        parser="hermes",
        subagents=[SubAgent()],
    )
    (trajectory,) = agent.run([toolgym.as_environment(Ask())], [{}])
    assert trajectory.status == "finished" and trajectory.reward == 1.0, trajectory.error
    result = trajectory.messages[2]
    assert result["content"] == "42" and result["subepisode"]["status"] == "finished"
    assert [s.role for s in trajectory.samples] == ["subagent", "policy"]
