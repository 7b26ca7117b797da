"""A user played by a model: what an environment's `user_turn` answers when no script can.

Multi-turn tool benchmarks (tau-bench, BFCL's multi-turn cases) have the user say more after
the agent's answer; where the user's words cannot be scripted, a model writes them from
instructions (who the user is, what they want). An environment keeps one `SimulatedUser` per
episode and hands it each answer:

    class Booking(toolgym.Environment):
        def reset(self, goal: str, **row) -> str:
            self.user = SimulatedUser(client, f"You want to {goal}.", max_turns=4)
            return self.user.opening()

        def user_turn(self, answer: str) -> str | None:
            return self.user.reply(answer)

The user's model reads the conversation from the user's side (the agent's answers as the
other party's messages, its own messages as its turns) and writes the next message, or
`stop` when its goal is met, which ends the conversation. Its failures are the environment's
(`ChatClientError`, or `ReadTimedOut` past `timeout`: the episode ends `env_error`, out of the
loss), never the policy's. The agent's answers reach it as text: their turn markers are
defused by the client (`toolgym.agents.chat_clients`).
"""

from __future__ import annotations

from toolgym.agents.chat_clients import ChatClient, ChatClientError, Messages
from toolgym.envs.calls import run_coroutine
from toolgym.envs.time_limits import within

USER_RULES = (
    "You are the user in a conversation with an AI assistant, not the assistant. Write only "
    "your next message to it, in one or two sentences, as this user would. When what you want "
    "is done, write exactly {stop} and nothing else."
)


class SimulatedUser:
    """The user's side of one conversation, written by a model.

    Args:
        client: The user's model (`EngineClient`, `OpenAIClient`, or any `ChatClient`).
        instructions: Who the user is and what they want (added to `USER_RULES`).
        first_message: The user's opening message; None: the model writes it.
        max_turns: The most messages after the opening one; then the conversation ends.
        stop: What the user writes when satisfied (the conversation then ends).
        timeout: Seconds one message may take.
    """

    def __init__(
        self,
        client: ChatClient,
        instructions: str,
        first_message: str | None = None,
        max_turns: int = 3,
        stop: str = "[done]",
        timeout: float = 60.0,
    ) -> None:
        if max_turns < 0 or not stop.strip():
            raise ValueError("max_turns must be >= 0 and stop a non-empty text")
        self.client, self.instructions = client, instructions
        self.max_turns, self.stop, self.timeout = max_turns, stop, timeout
        self.first_message = first_message
        self.history: Messages = []
        """The conversation as the user sees it: its own messages as `assistant`, the agent's
        answers as `user`."""
        self.replies = 0
        self.satisfied = False
        """Whether the user said its goal was met (wrote `stop`)."""

    def opening(self) -> str:
        """The user's first message."""
        text = self.first_message or self._write()
        self.history.append({"role": "assistant", "content": text})
        return text

    def reply(self, answer: str) -> str | None:
        """The user's next message after the agent's `answer`; None ends the conversation
        (the user is satisfied, or wrote `max_turns` messages already)."""
        if self.satisfied or self.replies >= self.max_turns:
            return None
        self.history.append({"role": "user", "content": answer})
        text = self._write()
        if self.stop in text:
            self.satisfied = True
            return None
        self.replies += 1
        self.history.append({"role": "assistant", "content": text})
        return text

    def _write(self) -> str:
        """The model's next message as the user (stripped; an empty one is its failure)."""
        rules = USER_RULES.format(stop=self.stop)
        system = {"role": "system", "content": f"{rules}\n\n{self.instructions}"}
        if not self.history:  # the opening: the model writes the first turn
            messages = [system, {"role": "user", "content": "Write your first message."}]
        else:
            messages = [system, *self.history]
        work = self.client.complete(messages)
        text = run_coroutine(within(work, self.timeout, "the simulated user", model_caused=False))
        if not str(text).strip():
            raise ChatClientError("the simulated user's model wrote nothing")
        return str(text).strip()
