"""Tree rollouts (issue 46 item 3): a group's first turns played once, the environment forked,
each member going on from the branch point; token-exact, the shared turns masked, the
members independent; a root that ends early gives an ordinary group; one GRPO step."""

from __future__ import annotations

import itertools

import pytest
from helpers import assert_token_exact, ids, tiny_grpo_args, trained_step
from sandbox_marks import needs_bwrap

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.algorithms.tree_rollouts import Branch, play_trees
from toolgym.testing import tiny_tokenizer

CALL = '<tool_call>\n{{"name": "add", "arguments": {{"points": {points}}}}}\n</tool_call><|im_end|>'


class Tally(toolgym.Environment):
    """Points added by tool calls; the reward is the total."""

    def reset(self, **row) -> str:
        self.total = 0
        return "Add points."

    def add(self, points: int) -> int:
        """Add points.

        Args:
            points: How many.
        """
        self.total += points
        self.reward = float(self.total)
        return self.total


def engine_for(tokenizer, first: str):
    """A policy whose reply depends on the calls made so far: `first` at the start, then one
    of 2, 3, 5 points (each branch its own), then an answer."""
    later = itertools.cycle([2, 3, 5])
    seen: list[int] = []

    def reply(prompt_ids):
        made = tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1  # turns so far
        seen.append(made)
        if made == 0:
            return ids(tokenizer, first)
        if made == 1:
            return ids(tokenizer, CALL.format(points=next(later)))
        return ids(tokenizer, "done<|im_end|>")

    return ScriptedEngine(reply), seen


def play(first: str, at_turn: int = 1, group: int = 3):
    tokenizer = tiny_tokenizer()
    engine, seen = engine_for(tokenizer, first)
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=4))
    envs = [toolgym.as_environment(Tally()) for _ in range(group)]
    rows = [{"prompt": []} for _ in range(group)]
    trajectories, played = play_trees(agent, envs, rows, [7] * group, group, at_turn)
    return agent, trajectories, played, seen


def test_members_share_the_root_s_turns_token_for_token_and_go_on_alone():
    agent, trajectories, played, seen = play(CALL.format(points=1))
    try:
        assert seen.count(0) == 1  # the first turn was generated once, for the root
        assert sorted(t.reward for t in trajectories) == [3.0, 4.0, 6.0]
        assert sorted(env.unwrapped.total for env in played) == [3, 4, 6]
        assert all(isinstance(env, Branch) for env in played)
        first = [t.samples[0] for t in trajectories]
        shared = len(agent.tokenizer(CALL.format(points=1))["input_ids"])
        for sample in first:
            assert sample.prompt_ids == first[0].prompt_ids
            assert sample.completion_ids[:shared] == first[0].completion_ids[:shared]
            assert set(sample.loss_mask[:shared]) == {0}  # the shared turn: not trained here
            assert 1 in sample.loss_mask[shared:]  # the member's own turns are
        tools = played[0].tools
        for trajectory in trajectories:
            assert trajectory.status == "finished"
            assert_token_exact(agent, trajectory, tools)
            assert trajectory.metrics["tool_calls"] == 2  # the root's call counts in each
    finally:
        for env in played:
            env.close()


def test_a_root_that_ends_before_the_branch_point_gives_an_ordinary_group():
    _, trajectories, played, seen = play("done<|im_end|>", at_turn=2)
    assert seen.count(0) == 4  # the root, then each member from the start
    assert not any(isinstance(env, Branch) for env in played)
    assert [t.reward for t in trajectories] == [0.0, 0.0, 0.0]
    assert all(1 in t.loss_mask for t in trajectories)


def tree_trainer(tmp_path, **settings):
    """A GRPO trainer of Tally on the tiny model with `engine_for`'s scripted policy
    (`settings`: the config's tree fields), and the list of turns each generation saw."""
    from toolgym.algorithms import GRPOTrainer
    from toolgym.testing import tiny_model

    tokenizer = tiny_tokenizer()
    engine, seen = engine_for(tokenizer, CALL.format(points=1))
    engine.update_weights = lambda *args, **kwargs: None
    args = tiny_grpo_args(tmp_path, branch_at_turn=1, limits={"max_turns": 4}, **settings)
    model = tiny_model(tokenizer)
    trainer = GRPOTrainer(
        model, Tally, [{"prompt": []}], args=args, tokenizer=tokenizer, engine=engine
    )
    return trainer, seen


def test_a_grpo_step_trains_the_members_after_the_branch_point(tmp_path):
    trainer, seen = tree_trainer(tmp_path, num_generations=3, micro_batch_size=3)
    tokenizer = trainer.tokenizer
    metrics, saved = trained_step(trainer, tmp_path)
    assert seen.count(0) == 1 and sorted(t.reward for t in saved) == [3.0, 4.0, 6.0]
    assert metrics["groups_without_signal"] == 0
    shared = len(tokenizer(CALL.format(points=1))["input_ids"])
    assert all(set(t.samples[0].loss_mask[:shared]) == {0} for t in saved)


def test_several_trees_a_group_train_their_shared_turns_once_each(tmp_path):
    """A group of 4 as 2 trees of 2 (`tree_size=2`): two roots, each member's shared turn
    keeps its loss mask and is credited with its tree's mean against the group's, its own
    turns against its sibling."""
    from toolgym.algorithms.credit import assign_credit

    trainer, seen = tree_trainer(
        tmp_path, num_generations=4, micro_batch_size=4, tree_size=2, scale_rewards="none"
    )
    tokenizer = trainer.tokenizer
    metrics, saved = trained_step(trainer, tmp_path)
    assert seen.count(0) == 2  # one root a tree
    rewards = [t.reward for t in saved]
    assert sorted(rewards) == [3.0, 3.0, 4.0, 6.0]  # 1 + one of 2, 3, 5 (cycled)
    shared = len(tokenizer(CALL.format(points=1))["input_ids"])
    for index, t in enumerate(saved):
        cut = t.shared[0]  # the root's call and its result
        assert cut > shared and len(t.shared) == 1
        sibling = saved[index ^ 1]  # the other member of its tree
        assert t.samples[0].completion_ids[:cut] == sibling.samples[0].completion_ids[:cut]
        assert set(t.samples[0].loss_mask[:shared]) == {1}  # the root's turn is trained
    credit = assign_credit(saved, list(range(4)), trainer.args, lambda values: values)
    assert credit.tokens is not None
    group_mean = sum(rewards) / 4
    for index, (t, tokens) in enumerate(zip(saved, credit.tokens, strict=True)):
        tree = rewards[index // 2 * 2 : index // 2 * 2 + 2]
        mean = sum(tree) / 2
        cut = t.shared[0]
        assert tokens[0][:cut] == pytest.approx([mean - group_mean] * cut)
        assert tokens[-1][-1] == pytest.approx(t.reward - mean)
    assert metrics["groups_without_signal"] == 0


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"tree_size": 2}, "set branch_at_turn"),
        ({"tree_size": 3, "branch_at_turn": 1}, "divide num_generations"),
        ({"tree_size": 1, "branch_at_turn": 1}, "at least 2"),
        (
            {"tree_size": 2, "branch_at_turn": 1, "credit": "turn", "step_rewards": "return"},
            "use one of them",
        ),
    ],
)
def test_bad_tree_sizes_are_refused(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        tiny_grpo_args(tmp_path, num_generations=4, **settings)


def inline_engine(tokenizer):
    """A REPL policy: the root writes `x = 20`; each member adds its own amount (1, 2 or 22),
    then submits x (the answer is 42: the member that added 22 wins)."""
    amounts = itertools.cycle([1, 2, 22])
    seen: list[str] = []

    def reply(prompt_ids):
        text = tokenizer.decode(prompt_ids).rpartition("<|im_start|>assistant")[2]
        if "x = 20" not in text:
            seen.append("root")
            return ids(tokenizer, "x = 20\n")
        if "x +=" not in text:
            seen.append("member")
            return ids(tokenizer, f"x += {next(amounts)}\n")
        return ids(tokenizer, "submit(x)\n")

    return ScriptedEngine(reply, tokenizer=tokenizer), seen


@pytest.mark.parametrize(
    "where", [pytest.param("local", id="local"), pytest.param("process", marks=[needs_bwrap])]
)
def test_an_inline_episode_branches_after_a_line_with_the_state_its_code_built(where):
    """The inline protocol (a live REPL, in this process or sandboxed): the root's first
    line runs once, the REPL is forked with the variable it set, and each member writes on
    in the same assistant turn."""
    from toolgym.builtin_envs.python_lines import PythonLines
    from toolgym.sandbox import sandboxed

    tokenizer = tiny_tokenizer()
    engine, seen = inline_engine(tokenizer)
    agent = Agent(engine, tokenizer, limits=AgentLimits(max_turns=5))
    if where == "local":
        envs = [toolgym.as_environment(PythonLines()) for _ in range(3)]
    else:
        envs = [sandboxed(PythonLines, {}, where) for _ in range(3)]
    rows = [{"task": "Make 42.", "answer": "42"} for _ in range(3)]
    trajectories, played = play_trees(agent, envs, rows, [3] * 3, 3, at_turn=1)
    try:
        assert seen == ["root", "member", "member", "member"]
        assert all(isinstance(env, Branch) for env in played)
        assert sorted(t.reward for t in trajectories) == [0.0, 0.0, 1.0]
        answers = sorted(
            t.messages[-1]["content"].rpartition("submitted ")[2] for t in trajectories
        )
        assert answers == ["21\n", "22\n", "42\n"]  # each fork held x = 20 and went on alone
        root_line = len(ids(tokenizer, "x = 20\n"))
        for trajectory in trajectories:
            assert trajectory.status == "env_done"
            (sample,) = trajectory.samples  # one assistant turn, one sequence
            assert set(sample.loss_mask[:root_line]) == {0}  # the root's line: not trained
            assert sample.loss_mask[root_line:].count(1) > 0
            assert sample.completion_ids[:root_line] == ids(tokenizer, "x = 20\n")
            assert trajectory.metrics["tool_calls"] == 3  # the root's line counts in each
            (message,) = [m for m in trajectory.messages if m["role"] == "assistant"]
            assert message["content"].startswith("x = 20\n") and "submit(x)" in message["content"]
            whole = tokenizer.decode(sample.completion_ids, skip_special_tokens=False)
            assert whole == message["content"]  # the message is the turn as the model saw it
    finally:
        for env in {id(e): e for e in [*envs, *played]}.values():
            env.close()
