"""The limits of one episode, declared once: the agent, the trainers' configs and the CLI all
read them from here (`AgentLimits`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from toolgym.envs.time_limits import TimeLimits


@dataclass
class AgentLimits:
    """Limits of one episode. A limit that ends an episode names its status."""

    max_turns: int = field(
        default=10,
        metadata={
            "help": "assistant turns (generations) per episode; the episode ends with status "
            "max_turns after this many (an environment's own max_turns counts the same turns)"
        },
    )
    max_new_tokens: int = field(
        default=256, metadata={"help": "tokens the model may write in one turn"}
    )
    max_episode_tokens: int = field(
        default=2048,
        metadata={
            "help": "completion budget per episode (model plus observation tokens); the "
            "episode ends with status length when it is spent"
        },
    )
    tool_timeout: float = field(
        default=30.0,
        metadata={
            "help": "seconds one turn's tool calls may take together (also an inline step or "
            "a final answer); past it the episode ends with status tool_timeout, the model's "
            "outcome (in the loss)"
        },
    )
    tool_call_timeout: float = field(
        default=30.0,
        metadata={
            "help": "seconds one tool call may take; past it the call is stopped and the "
            "episode ends with status tool_timeout, the model's outcome (in the loss)"
        },
    )
    model_failure_reward: float | None = field(
        default=None,
        metadata={
            "help": "reward of an episode the model's own failure ended (tool_timeout, "
            "tool_crash, too_many_calls) in place of the environment's last reported one; "
            "set it at or below a wrong answer's reward where failing could otherwise pay",
            "type": float,
        },
    )
    invalid_call_reward: float = field(
        default=0.0,
        metadata={
            "help": "step reward of each tool call refused before any tool ran (malformed, "
            "an unknown tool, invalid arguments), kept with the turn that made it and "
            "outside the environment's reward (GRPOConfig.step_rewards: 'return' adds it to "
            "the episode's reward, 'tokens' to that turn's tokens); negative to make such "
            "calls cost something; 0: none. Only where the rollout steps through "
            "RolloutContext.step (the chat loop, rollout functions that call ctx.step): an "
            "agent program (program_rollout) calls the tools itself and gets none"
        },
    )
    max_tool_calls_per_turn: int = field(
        default=32,
        metadata={
            "help": "tool calls one assistant turn may make; a turn with more runs none of "
            "them and ends the episode with status too_many_calls, the model's outcome "
            "(in the loss)"
        },
    )

    @property
    def time_limits(self) -> TimeLimits:
        """The seconds the model's calls into an environment may take, as the stepping layer
        applies them (`toolgym.envs.time_limits`)."""
        return TimeLimits(call=self.tool_call_timeout, turn=self.tool_timeout)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add `--max-turns`, `--max-new-tokens`, ... (defaults and help from the fields)."""
        for item in fields(cls):
            parser.add_argument(
                f"--{item.name.replace('_', '-')}",
                type=item.metadata.get("type", type(item.default)),
                default=item.default,
                help=f"{item.metadata['help']} (default: {item.default})",
            )

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> AgentLimits:
        """The limits parsed by `add_arguments`."""
        return cls(**{item.name: getattr(args, item.name) for item in fields(cls)})
