"""The OpenEnv side of `toolgym serve --protocol openenv` (see `toolgym.cli.serve_openenv`):
openenv-core's `Environment` over one toolgym instance, its action and its observation.
Imports openenv-core, so it is imported only when serving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal
from uuid import uuid4

import pydantic
from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.env_server.types import EnvironmentMetadata


def action_class(tools: list[dict[str, Any]]) -> type[Action]:
    """The action: a tool's name (an enum of the tools and `final_answer`) and arguments."""
    names = (*(tool["function"]["name"] for tool in tools), "final_answer")
    listing = "; ".join(
        f"{tool['function']['name']}: {tool['function'].get('description', '')}".strip()
        for tool in tools
    )
    fields: dict[str, Any] = {
        "tool": (Literal[names], pydantic.Field(description="The tool's name.")),
        "arguments": (
            dict[str, Any],
            pydantic.Field(default_factory=dict, description="The tool's arguments."),
        ),
    }
    return pydantic.create_model(
        "ToolCallAction",
        __base__=Action,
        __doc__=f"Call one of the environment's tools ({listing}), or hand in the final "
        "answer with final_answer(text).",
        **fields,
    )


class ToolCallObservation(Observation):
    """A tool message (or the reset's text), and what the step did."""

    content: str = pydantic.Field(default="", description="The tool message.")
    tool: str | None = pydantic.Field(default=None, description="The tool called.")
    failure: str | None = pydantic.Field(
        default=None, description="toolgym's failure kind; None: the call succeeded."
    )
    turn: int = pydantic.Field(default=0, description="Turns taken in this episode.")
    tools: list[dict[str, Any]] | None = pydantic.Field(
        default=None, description="The tools' JSON schemas (at reset)."
    )


class ServedEnvironment(Environment):
    """One toolgym environment instance (`make()`'s) behind an OpenEnv session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # an instance per session: nothing shared

    def __init__(self, make: Callable[[], Any], spec: str, names: list[str]) -> None:
        super().__init__()
        self.env = make()
        self.spec, self.names = spec, names
        self.episode_id: str | None = None
        self.steps = 0

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **row: Any
    ) -> ToolCallObservation:
        """Start an episode from a dataset row's columns; its text and the tools."""
        text = self.env.reset(seed=seed, **row)
        self.episode_id, self.steps = episode_id or str(uuid4()), 0
        return ToolCallObservation(content=text or "", tools=self.env.tools)

    def step(
        self, action: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> ToolCallObservation:
        """One tool call (or the final answer); a step before any reset resets first."""
        from toolgym.envs.calls import ToolCall

        if not _stepper(self.env).started:
            self.reset()
        self.steps += 1
        before = self._reward_so_far()
        if action.tool == "final_answer":
            self.env.final_answer(str(action.arguments.get("text", "")))
            return self._observation("The answer was handed in.", "final_answer", None, before)
        step = self.env.step(ToolCall(action.tool, dict(action.arguments)))
        (result,) = step.results
        return self._observation(result.content, action.tool, result.failure, before)

    def _observation(
        self, content: str, tool: str, failure: str | None, before: float | None
    ) -> ToolCallObservation:
        over = _over(self.env)
        if _stepper(self.env).reward_per_step:
            now = self.env.get_reward()
            reward = None if now is None else now - (before or 0.0)
        else:
            reward = self.env.get_reward() if over else None
        return ToolCallObservation(
            content=content,
            tool=tool,
            failure=failure,
            turn=_stepper(self.env).turn,
            reward=reward,
            done=over,
        )

    def _reward_so_far(self) -> float | None:
        if not _stepper(self.env).reward_per_step:
            return None  # read once, when the episode ends (a plain class's reward)
        return self.env.get_reward()

    @property
    def state(self) -> State:
        """The episode's id and steps, and toolgym's reward, done and turn."""
        started = _stepper(self.env).started
        return State(
            episode_id=self.episode_id,
            step_count=self.steps,
            reward=self.env.get_reward() if started else None,
            done=_over(self.env) if started else False,
            turn=_stepper(self.env).turn,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        """The environment's name and tools."""
        return EnvironmentMetadata(
            name=f"toolgym {self.spec}",
            description=f"The toolgym environment {self.spec} (tools: {', '.join(self.names)}).",
        )

    def close(self) -> None:
        """Close the toolgym instance."""
        self.env.close()


def _stepper(env: Any) -> Any:
    return getattr(env, "stepper", env)


def _over(env: Any) -> bool:
    stepper = _stepper(env)
    return bool(
        env.done
        or getattr(stepper, "truncated", False)
        or getattr(stepper, "answered", False)
        or getattr(stepper, "ended", None) is not None
    )
