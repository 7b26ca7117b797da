"""The inline protocol: the model writes inside one assistant turn, generation stops at a
marker the environment declares (`Environment.inline_markers`, e.g. `"</code>"` or `"\\n"`),
the environment reads the text written since the last marker (`inline_step`) and answers with
an `InlineStep`, whose observation is appended to the same turn as tokens the model did not
sample; generation then resumes, until the model ends its turn, the environment is done, or
a limit is reached."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class InlineStep:
    """The environment's answer to one marked piece of the model's text.

    Attributes:
        observation: Text appended inline after the marker (None or "": nothing).
        reward: A reward for this step, kept with the token span it follows
            (`Trajectory.step_rewards`); separate from the episode's `get_reward()`.
        done: The environment ends the episode (status `env_done`).
        failed: The step's text was a mistake (a line that raised, say): counted with the
            episode's `tool_failures`, as a failed tool call is.
    """

    observation: str | None = None
    reward: float = 0.0
    done: bool = False
    failed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain types, for a sandbox worker's answer."""
        return asdict(self)


def as_inline_step(value: Any) -> InlineStep:
    """What `inline_step` returned, as an `InlineStep`: a string is an observation, None is
    nothing to add, a dict holds the fields. A reward that is not a finite number is an error
    (one NaN would poison its whole group)."""
    if isinstance(value, dict):
        value = InlineStep(**value)
    if isinstance(value, InlineStep):
        reward = float(value.reward)
        if not math.isfinite(reward):
            raise ValueError(f"inline_step returned the reward {reward}, not a finite number")
        value.reward = reward
        return value
    if value is None or isinstance(value, str):
        return InlineStep(observation=value)
    raise TypeError(
        f"inline_step must return an InlineStep, a string or None, not {type(value).__name__}"
    )
