"""The environment protocol in one table: what toolgym calls or reads on an environment
besides its tools.

Everything that needs the protocol's names reads them here: the tool tables (a name of the
protocol is never a tool on an `Environment` subclass; on a plain class a hook's name is
refused unless marked `@toolgym.hook`), the clash messages, and the sandbox worker, which
serves each hook that crosses the process boundary through the `Executor` method the table
names. Adding a hook is one row in `HOOKS` (and its `Executor` method where it crosses a
sandbox); `tests/test_architecture.py` checks that `RESERVED_NAMES` are exactly
`Environment`'s public names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    """One name of the protocol that the environment itself provides."""

    name: str
    does: str
    """What toolgym does with it, for messages: "calls close() to release the instance"."""
    method: bool
    """Called (a method) rather than read (an attribute or property)."""
    executor: str | None = None
    """The `Executor` method that serves it across a sandbox (the worker's `invoke`)."""


HOOKS: dict[str, Hook] = {
    hook.name: hook
    for hook in (
        Hook("get_reward", "reads get_reward() as the episode's reward", True, "read_reward"),
        Hook(
            "close", "calls close() to release the instance when it is done with it", True, "close"
        ),
        Hook(
            "final_answer",
            "hands final_answer(text) the model's last message (an answer without a tool "
            "call) to grade",
            True,
            "final_answer",
        ),
        Hook(
            "user_turn",
            "hands user_turn(answer) the model's answer without a tool call and reads the "
            "user's next message (None: the user is done)",
            True,
            "user_turn",
        ),
        Hook(
            "episode_metrics",
            "reads episode_metrics() as the episode's named figures",
            True,
            "metrics",
        ),
        Hook(
            "demonstration",
            "reads demonstration() as an expert's calls for a warm-up",
            True,
            "demonstration",
        ),
        Hook(
            "inline_step",
            "hands inline_step(text) what the model wrote in the inline protocol",
            True,
            "inline",
        ),
        Hook(
            "snapshot_state",
            "reads snapshot_state() as what a snapshot or fork of the episode keeps",
            True,
        ),
        Hook(
            "restore_state",
            "hands restore_state(state) a snapshot's state to go back to",
            True,
        ),
        Hook(
            "done",
            "reads `done` as whether the episode is over (an attribute, not a method)",
            False,
        ),
        Hook("reward", "reads `reward` as the episode's reward (an attribute or property)", False),
        Hook("max_turns", "reads `max_turns` as the episode's turn limit (an attribute)", False),
        Hook(
            "inline_markers",
            "reads `inline_markers` as the inline protocol's markers (an attribute)",
            False,
        ),
        Hook(
            "reward_per_step",
            "reads `reward_per_step` as whether steps report reward changes",
            False,
        ),
        Hook(
            "strict_arguments",
            "reads `strict_arguments` as whether tool arguments reach the tools as sent",
            False,
        ),
        Hook(
            "seed_global_random",
            "reads `seed_global_random` as whether to seed the random module",
            False,
        ),
    )
}

BASE_NAMES = frozenset({"reset", "rng"})
"""The rest of `Environment`'s public names: the episode's start and its seeded generator."""

RESERVED_NAMES = frozenset(HOOKS) | BASE_NAMES
"""Names of the environment protocol: never tools on `Environment` subclasses."""

TRL_NOT_TOOLS = frozenset({"reset", "get_reward"})
"""The public methods TRL's `environment_factory` never exposes as tools."""

HOOK_NAMES: dict[str, str] = {
    name: hook.does for name, hook in HOOKS.items() if name not in TRL_NOT_TOOLS
}
"""The names toolgym calls or reads on a plain instance, each with what it does with it (a
plain method of such a name is refused unless marked `@hook`)."""

METHOD_HOOKS = frozenset(
    name for name, hook in HOOKS.items() if hook.method and name not in TRL_NOT_TOOLS
)
"""The hooks toolgym calls (`@toolgym.hook` marks a plain method as one of them)."""

INVOKABLE: dict[str, str] = {
    name: hook.executor for name, hook in HOOKS.items() if hook.executor is not None
}
"""The hooks a sandbox worker serves (`invoke`), each by its `Executor` method."""
