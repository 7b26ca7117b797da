"""`Environment`: the base class of an environment's state and tools.

An environment is one episode's worth of state. `reset(**row)` starts an episode from a
dataset row; every public method is a tool the model may call. The class is plain: defaults
for the protocol's hooks (`toolgym.envs.hooks`) and a seeded `rng`, nothing more. Stepping
(argument checks, turns, error messages, seeding at reset) is the `Stepper`'s job
(`toolgym.envs.stepping`), the one class that steps an `Environment`, a plain class and a
sandboxed instance alike:

    env = toolgym.as_environment(MyEnvironment())   # or toolgym.make("MyEnv-v0")
    env.reset(seed=0, **row)
    env.step(ToolCall("guess", {"word": "crane"}))
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, ClassVar

from toolgym.envs.calls import Demonstration
from toolgym.envs.inline import InlineStep


class Environment:
    """Base class for toolgym environments; one instance per rollout.

    Subclass it, implement `reset(**row)` and write tools as public methods with type hints and
    a Google-style docstring. Set `self.reward` and `self.done` from the tools; read `self.rng`
    for randomness so that two instances reset with the same seed behave the same.

    The stepping layer starts every episode (`begin_episode`): `rng` seeded with the row's
    seed, `reward` and `done` cleared; then it calls `reset` with only the columns the
    override accepts. An override needs no `super().reset()`; one that calls it keeps the
    episode's seed (only an explicit `seed=` reseeds `rng`).

    Attributes:
        reward: The episode's reward so far (set it from the tools).
        done: True once the episode is over (the environment says so).
        max_turns: Assistant turns before the episode is truncated (None: no limit of its own).
            The agent's `AgentLimits.max_turns` counts the same turns.
        rng: A `random.Random` seeded with the episode's seed.
    """

    reward: float = 0.0
    done: bool = False
    max_turns: int | None = None
    seed_global_random: ClassVar[bool] = False
    """Set True if the class draws from the `random` module (not `self.rng`) and cannot be
    changed: toolgym then seeds the module with the episode's seed before each reset (such
    resets take turns); without it, the first reset warns (`toolgym.envs.seeding`)."""
    reward_per_step: ClassVar[bool] = True
    """Whether `step` reports the change of `reward` over each step (the reward is read before
    and after every step). An `Environment`'s tools set a plain `reward` attribute, so reading
    it often is free; a subclass whose `reward` is computed when read (a verifier run once, on
    first access) sets this False: the reward is then read once, when the episode ends, as for
    a plain class (TRL's contract)."""
    strict_arguments: ClassVar[bool] = False
    """Set True to pass a call's arguments to the tools as the model sent them (JSON values,
    as TRL and BFCL pass them), checking only their names: no `"42"` -> `42` coercion and no
    type check. Plain (TRL-shaped) classes get this by default; they set it False for
    toolgym's checks (`toolgym.envs.tools`)."""
    inline_markers: ClassVar[tuple[str, ...]] = ()
    """Markers of the inline protocol (`toolgym.envs.inline`): when not empty, the model writes
    in one assistant turn, generation stops after each marker and `inline_step` answers the
    text written since the last one; the chat tool-call protocol is not used."""

    def __init__(self) -> None:
        """No constructor arguments of its own: a subclass that takes some defines `__init__`
        (an unknown argument is a TypeError, not silently dropped)."""

    # -- the episode ---------------------------------------------------------------------------
    def reset(self, *args: Any, **kwargs: Any) -> str | None:
        """Start an episode from a dataset row's columns (and `seed`); a returned string is
        shown first.

        Subclasses override this with the columns they need (the stepping layer passes only
        those) and need not call `super().reset()`; the episode is already seeded when it
        runs. A `seed` passed here (first argument or keyword) reseeds `rng`; None keeps the
        episode's. Any signature may override this one.
        """
        seed = kwargs.get("seed", args[0] if args else None)
        if seed is not None:
            self._rng = random.Random(seed)
        return None

    def close(self) -> None:
        """Release what the environment holds (processes, files); called once at the end."""

    def get_reward(self) -> float | None:
        """The episode's reward so far (None: no reward)."""
        return None if self.reward is None else float(self.reward)

    def final_answer(self, text: str) -> None:
        """Called with the model's last message when it answers without calling a tool.

        Environments that grade a final answer (rather than a tool call) override this and
        set `reward` / `done`. The default ignores the text.
        """

    def user_turn(self, answer: str) -> str | None:
        """The user's next message after the model answered `answer` without a tool call, for
        episodes of several user turns (a scripted list of requests, a simulated user); the
        model then takes its next turn. None: the user has nothing more to say, and the answer
        goes to `final_answer` (the episode ends). The default has one user turn: None.

        It must not grade the answer (that is `final_answer`'s, once, at the end); it may set
        `reward` for what the turns so far achieved. An exception it raises is the model's
        (as in a tool), unless it is an `EnvironmentBug`."""
        return None

    def inline_step(self, text: str) -> InlineStep | str | None:
        """The inline protocol's step: `text` is what the model wrote since the last marker,
        the marker included. Return an observation to append inline (a string), an
        `InlineStep` (observation, per-step reward, done), or None. Set `reward` / `done` as
        from a tool. Needed when `inline_markers` is set."""
        raise NotImplementedError(
            f"{type(self).__name__} sets inline_markers but does not implement inline_step"
        )

    def episode_metrics(self) -> dict[str, float]:
        """Named figures of the episode besides its reward, read once when it ends: the skills
        behind the reward (Wordle: `valid_guesses`, `consistent_guesses`, `win`, ...), so a
        run can say which one moved. Trainers log each one's mean per step as `env/<name>`,
        evaluations summarise them, and the run viewer plots them. The default has none."""
        return {}

    def demonstration(self) -> Demonstration | None:
        """An expert's tool calls for the current episode, one list per turn (for SFT warm-up);
        for inline environments, the pieces of text the expert writes, each ending with a
        marker.

        Called right after `reset`; it must not change the episode's state. The default has
        no expert and returns None.
        """
        return None

    def snapshot_state(self) -> Any:
        """What a snapshot or a fork of the episode keeps of this environment
        (`toolgym.envs.snapshots`). The default (not overridden) deep-copies every attribute;
        override it with `restore_state` to copy only what matters."""
        return dict(vars(self))

    def restore_state(self, state: Any) -> None:
        """Go back to `state`, a copy of what `snapshot_state` returned (the default puts the
        attributes back)."""
        vars(self).clear()
        vars(self).update(state)

    @property
    def rng(self) -> random.Random:
        """This episode's random generator, seeded with the episode's seed."""
        if "_rng" not in self.__dict__:
            self._rng = random.Random()
        return self._rng


def begin_episode(instance: object, seed: int | None) -> None:
    """What the stepping layer does before every reset: an `Environment`'s `rng` seeded and
    its `reward` cleared; any instance's `done` cleared (where it can be set)."""
    if isinstance(instance, Environment):
        instance._rng = random.Random(seed)
        instance.reward = 0.0
    if hasattr(instance, "done"):
        with contextlib.suppress(AttributeError):  # a read-only property
            instance.done = False
