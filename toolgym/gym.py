"""`GymnasiumEnv`: any toolgym environment as a `gymnasium.Env` with text spaces.

`import toolgym.gym` registers every toolgym id under gymnasium's `toolgym/` namespace:

    import gymnasium
    import toolgym.gym  # noqa: F401
    env = gymnasium.make("toolgym/Wordle-v0")   # or, without the import:
    env = gymnasium.make("toolgym.gym:toolgym/Wordle-v0")

Observations are text: at reset, the row's prompt and what `reset` returned; after a step, the
tool results. An action is the assistant's text: `<tool_call>{"name": ..., "arguments": ...}
</tool_call>` blocks, or a JSON tool call, or a JSON list of them. Text with no tool call is the
model's final answer: it goes to `final_answer()` and the episode terminates.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from typing import Any

import gymnasium
from gymnasium import spaces

from toolgym.agents.parsers.json_formats import parse_hermes
from toolgym.envs.calls import MalformedToolCall, ToolCall, tool_call_from_dict
from toolgym.registry import EnvSpec, on_register, spec

Row = dict[str, Any]


class ChatText(spaces.Text):
    """A `Text` space holding any Unicode string up to its maximum length.

    gymnasium's `Text` checks every character against a fixed charset; chat text and tool
    output can hold any character, so membership checks only type and length. Samples are
    drawn from printable ASCII.
    """

    def __init__(self, max_length: int, seed: int | None = None) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        """Any string up to the maximum length."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def parse_action(text: str) -> list[ToolCall | MalformedToolCall]:
    """The tool calls in an assistant message: Hermes `<tool_call>` blocks (the agents'
    Hermes parser), or a bare JSON call or list of calls."""
    if "<tool_call>" in text:
        return parse_hermes(text).tool_calls
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return []
    try:
        decoded = json.loads(stripped)
    except json.JSONDecodeError:
        return []  # prose that happens to start with a bracket: a final answer
    except (ValueError, RecursionError) as error:  # digit limit, nesting past the stack
        return [MalformedToolCall(stripped[:200], f"unreadable JSON ({type(error).__name__})")]
    items = decoded if isinstance(decoded, list) else [decoded]
    if not items or not all(isinstance(i, dict) and "name" in i for i in items):
        return []
    return [tool_call_from_dict(item) for item in items]


class GymnasiumEnv(gymnasium.Env[str, str]):
    """A toolgym environment seen through gymnasium's API.

    Args:
        env: The environment (an `Environment`, a `Stepper`, a sandboxed instance).
        render_mode: None or `"ansi"` (the transcript so far as text).
        row_sampler: `f(seed) -> row` used by `reset` when no `options` row is given; the
            registry passes one drawing from the environment's prompt dataset.
        max_observation_length: Upper length of the observation space.
        max_action_length: Upper length of the action space.
    """

    # render_fps only matters to video recorders; gymnasium warns when it is missing.
    metadata = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012

    def __init__(
        self,
        env: Any,
        render_mode: str | None = None,
        row_sampler: Callable[[int], Row] | None = None,
        max_observation_length: int = 1 << 20,
        max_action_length: int = 1 << 16,
    ) -> None:
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be None or 'ansi', not {render_mode!r}")
        self.env = env
        self.render_mode = render_mode
        self.row_sampler = row_sampler
        self.observation_space = ChatText(max_observation_length)
        self.action_space = ChatText(max_action_length)
        self._transcript: list[str] = []
        self._answered = False
        self._ended = False

    def reset(self, *, seed: int | None = None, options: Row | None = None) -> tuple[str, Row]:
        """Start an episode from `options` (a dataset row) or a row drawn with `seed`; the
        observation is the prompt and what the environment's reset returned."""
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        row = dict(options) if options is not None else self._sample_row(episode_seed)
        prompt = row.pop("prompt", None)
        row.setdefault("seed", episode_seed)
        first = self.env.reset(**row)
        observation = "\n\n".join(part for part in (_prompt_text(prompt), first) if part)
        self._transcript = [observation]
        self._answered = False
        self._ended = False
        return observation, {"tools": self.env.tools}

    def step(self, action: str) -> tuple[str, float, bool, bool, Row]:
        """Play the assistant's text: its tool calls, or, with none, its final answer."""
        if self._answered:
            return "Error: the episode is over.", 0.0, True, False, {"tool_calls": 0}
        self._transcript.append(f"assistant: {action}")
        calls = parse_action(action)
        if not calls:
            # per-step rewards: the answer's change; otherwise the episode's reward, read once
            # now that it ends (a lazy reward is not read before the answer); 0 if a step ended it
            per_step = getattr(self.env, "reward_per_step", True)
            before = (self.env.get_reward() or 0.0) if per_step else 0.0
            self.env.final_answer(action)
            self._answered = True
            reward = 0.0 if self._ended else (self.env.get_reward() or 0.0) - before
            info = {"turn": self.env.turn, "tool_calls": 0, "final_answer": True}
            return "", reward, True, False, info
        result = self.env.step(calls)
        self._ended = result.terminated or result.truncated
        observation = "\n".join(f"{m['name']}: {m['content']}" for m in result.messages)
        self._transcript.append(observation)
        return observation, result.reward, result.terminated, result.truncated, result.info

    def render(self) -> str | None:
        """The transcript so far (render_mode "ansi")."""
        if self.render_mode == "ansi":
            return "\n".join(self._transcript)
        return None

    def close(self) -> None:
        """Close the environment."""
        self.env.close()

    def _sample_row(self, seed: int) -> Row:
        return dict(self.row_sampler(seed)) if self.row_sampler is not None else {}


def make_gymnasium_env(
    toolgym_id: str, render_mode: str | None = None, **kwargs: Any
) -> GymnasiumEnv:
    """The gymnasium entry point of `toolgym/<id>`: the registered environment (made with
    `kwargs`), resets drawing rows from its prompt dataset."""
    env_spec = spec(toolgym_id)
    sampler = None
    if env_spec.dataset_builder is not None:
        sampler = lambda seed: env_spec.dataset(1, seed=seed)[0]  # noqa: E731
    return GymnasiumEnv(env_spec.make(**kwargs), render_mode, sampler)


make_gymnasium_env.metadata = GymnasiumEnv.metadata  # type: ignore[attr-defined]


def _prompt_text(prompt: Any) -> str:
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(m["content"] for m in prompt if m.get("role") in ("system", "user"))


def _register_gymnasium_id(env_spec: EnvSpec) -> None:
    if env_spec.per_row:  # its tools depend on the row, which gymnasium's make does not have
        return
    gym_id = env_spec.gymnasium_id
    gymnasium.registry.pop(gym_id, None)  # re-registration replaces, like toolgym's own
    gymnasium.register(
        id=gym_id,
        entry_point="toolgym.gym:make_gymnasium_env",
        kwargs={"toolgym_id": env_spec.id},
    )


# Importing this module gives every toolgym id, present and future, a gymnasium id (gymnasium
# 1.x has no plugin discovery; like other packages, toolgym registers when imported).
on_register(_register_gymnasium_id)
