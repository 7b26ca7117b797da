"""A scripted game whose tool call scores the points it names, per turn: the model's turns
follow a plan of points (`PLAN`), so each turn's reward and its tokens are known. Shared by the
step-reward tests of the chat loop and the turn-credit tests of the algorithms."""

from __future__ import annotations

import pytest
from helpers import ids

import toolgym
from toolgym.agents import Agent, ScriptedEngine, Trajectory
from toolgym.testing import tiny_tokenizer

CALL = '<tool_call>\n{{"name": "add", "arguments": {{"points": {points}}}}}\n</tool_call><|im_end|>'
DONE = "done<|im_end|>"
ROW = {"prompt": [{"role": "user", "content": "Score some points."}]}


class Points(toolgym.Environment):
    """Each `add(points)` adds its points to the episode's reward; `reset` tells the plan."""

    def __init__(self, plan: tuple[float, ...] = ()) -> None:
        self.plan = plan

    def reset(self, **_) -> str:
        return "Plan: " + ", ".join(f"{p:g}" for p in self.plan)

    def add(self, points: float) -> str:
        """Add points to the reward.

        Args:
            points: How many.
        """
        self.reward += points
        return f"total {self.reward:g}"


def plan_replies(tokenizer, plan: tuple[float, ...]) -> list[list[int]]:
    """The turns that play `plan`: one `add` call per entry, then a final answer."""
    return [ids(tokenizer, CALL.format(points=p)) for p in plan] + [ids(tokenizer, DONE)]


def follow_the_plan(tokenizer):
    """A script that reads its plan from the prompt and makes the next call of it."""

    def reply(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        plan = tuple(float(p) for p in text.split("Plan: ")[1].split("<")[0].split(", "))
        return plan_replies(tokenizer, plan)[text.count("total ")]

    return reply


def model_turns(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of sampled tokens: the assistant turns of one sequence."""
    turns, start = [], None
    for position, value in enumerate([*mask, 0]):
        if value and start is None:
            start = position
        elif not value and start is not None:
            turns.append((start, position))
            start = None
    return turns


PLAN = (0.5, 0.0, -0.25)  # a turn that earns 0 records nothing


def play(plan=PLAN, per_turn=False) -> tuple[Trajectory, Agent]:
    tokenizer = tiny_tokenizer()
    agent = Agent(
        ScriptedEngine(plan_replies(tokenizer, plan)), tokenizer, parser="hermes", per_turn=per_turn
    )
    (trajectory,) = agent.run([toolgym.as_environment(Points(plan))], [dict(ROW)])
    assert trajectory.status == "finished" and trajectory.reward == pytest.approx(sum(plan))
    return trajectory, agent
