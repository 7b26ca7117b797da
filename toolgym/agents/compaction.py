"""Context compaction: past a token budget, the conversation the model sees is cut down and the
episode goes on in a new sample.

Long agent episodes outgrow a context (a small model's 2k or 8k tokens, or a budget chosen for
speed). With `Agent(compaction=Compaction(max_prompt_tokens=...))`, before each turn after the
first the chat loop checks the sequence the model would continue; past the budget it keeps the
head of the conversation (system turns and the first user turn: the task) and the latest
`keep_turns` assistant turns with their tool results, and drops the turns between, replaced
by a note or, with `summary=True`, by a summary the model writes first. The episode then goes
on in a new `Sample` whose prompt is the template's rendering of the compacted conversation
(its `parent` the sample before), so the trajectory is a graph of samples:

    sample 0: the episode up to the budget            (parent None)
    sample 1: the summary turn (summary=True)         (parent 0)   prompt: all of it + request
    sample 2: the compacted conversation, carried on  (parent 1)   prompt: head + summary + tail

Every sample trains as any other (`Trajectory.samples`): the summary turn's tokens are sampled,
so the summary is trained with the episode's advantage. `Trajectory.messages` keeps the whole
conversation (the summary request and answer marked `"compaction": "summary"`); the token
budget (`AgentLimits.max_episode_tokens`) counts every token of the episode across samples.
A hook (`Compaction(hook=fn)`) replaces the rule: `fn(messages, summary)` returns the
conversation to continue from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolgym.agents.trajectory import Trajectory

if TYPE_CHECKING:
    from toolgym.agents.custom import RolloutContext

Message = dict[str, Any]

SUMMARY_PROMPT = (
    "The conversation is getting too long. Summarise what has happened so far: what the task "
    "is, what you tried, what you learned from the results, and what is left to do. Write the "
    "summary only; do not call a tool."
)
"""The user turn that asks for a summary (`Compaction.summary_prompt`)."""


@dataclass(frozen=True)
class Compaction:
    """When and how an episode's conversation is compacted (`Agent(compaction=...)`).

    Args:
        max_prompt_tokens: Compact before a turn whose prompt (the sequence the model would
            continue) is longer than this many tokens.
        keep_turns: The latest assistant turns kept as they were, each with the tool results
            and user turns after it (at least 1).
        summary: The model first writes a summary of the conversation (a sampled, trained
            turn answering `summary_prompt`), which replaces the dropped turns; False: they
            are dropped, and a note says how many.
        summary_prompt: The user turn that asks for the summary.
        hook: Your own compaction: `hook(messages, summary)` gets the conversation the model
            sees and the summary's text (None without `summary`) and returns the conversation
            to continue from (None or the same length: nothing to compact).
    """

    max_prompt_tokens: int
    keep_turns: int = 1
    summary: bool = False
    summary_prompt: str = SUMMARY_PROMPT
    hook: Callable[[list[Message], str | None], list[Message] | None] | None = None

    def __post_init__(self) -> None:
        if self.max_prompt_tokens < 1:
            raise ValueError(
                f"Compaction.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}"
            )
        if self.keep_turns < 1:
            raise ValueError(f"Compaction.keep_turns must be >= 1, got {self.keep_turns}")

    def compacted(self, messages: list[Message], summary: str | None) -> list[Message] | None:
        """The conversation to continue from, or None where nothing can be dropped."""
        if self.hook is not None:
            kept = self.hook([dict(m) for m in messages], summary)
            return None if kept is None or len(kept) >= len(messages) else kept
        return compact_messages(messages, self.keep_turns, summary)

    async def apply(self, ctx: RolloutContext, trajectory: Trajectory) -> bool:
        """Compact `trajectory`'s conversation if its last sample is over the budget and
        something can be dropped; the episode then continues in a new sample. True if it did."""
        last = trajectory.samples[-1]
        if len(last.prompt_ids) + len(last.completion_ids) <= self.max_prompt_tokens:
            return False
        view = ctx.visible_messages(trajectory)
        if self.hook is None and compact_messages(view, self.keep_turns) is None:
            return False  # nothing to drop: the budget ends the episode, as without compaction
        used = ctx.tokens_used(trajectory)
        if len(trajectory.samples) > 1 and not last.completion_ids:
            trajectory.samples.pop()  # a per-turn prompt made for a turn that is not taken
        summary = await self._summary(ctx, trajectory, view, used) if self.summary else None
        kept = self.compacted(view, summary)
        if kept is None:  # the hook kept it all: go on from the whole view
            kept = view
        ctx.continue_from(trajectory, kept, used=None if self.summary else used)
        ctx.metrics["compactions"] = ctx.metrics.get("compactions", 0.0) + 1
        return True

    async def _summary(
        self, ctx: RolloutContext, trajectory: Trajectory, view: list[Message], used: int
    ) -> str:
        """The model's summary of `view`, sampled in a sample of its own (trained)."""
        request = {"role": "user", "content": self.summary_prompt, "compaction": "summary"}
        ctx.continue_from(trajectory, [*view, request], keep_view=True, used=used)
        ctx.add_message(trajectory, request, visible=False)
        generation = await ctx.generate(trajectory)
        text = generation.text.strip()
        answer = {"role": "assistant", "content": text, "raw_content": generation.text}
        ctx.add_message(trajectory, {**answer, "compaction": "summary"}, visible=False)
        return text


def compact_messages(
    messages: list[Message], keep_turns: int, summary: str | None = None
) -> list[Message] | None:
    """`messages` with the turns between the head (system turns and the first user turn) and
    the latest `keep_turns` assistant turns (with what follows each) dropped; the first user
    turn then ends with the summary (or, without one, a note of how many turns were dropped
    in all), so that user and assistant turns still alternate. A first user turn compacted
    before keeps its own text under `"compacted"`: the new note or summary replaces the old.
    None where nothing would be dropped."""
    head_end = next((i + 1 for i, m in enumerate(messages) if m["role"] == "user"), None)
    if head_end is None:
        return None
    assistants = [i for i in range(head_end, len(messages)) if messages[i]["role"] == "assistant"]
    if len(assistants) <= keep_turns:
        return None
    tail_start = assistants[-keep_turns]
    task = dict(messages[head_end - 1])
    before = task.pop("compacted", None) or {"content": task["content"], "dropped": 0}
    dropped = before["dropped"] + sum(1 for i in assistants if i < tail_start)
    if summary:
        addition = f"Summary of the earlier turns:\n{summary}"
    else:
        addition = f"[{dropped} earlier turn{'s' if dropped != 1 else ''} removed to save space]"
    content = before["content"]
    task["compacted"] = {"content": content, "dropped": dropped}
    if isinstance(content, list):  # content blocks (text and images)
        task["content"] = [*content, {"type": "text", "text": addition}]
    else:
        task["content"] = f"{content}\n\n{addition}"
    return [*messages[: head_end - 1], task, *messages[tail_start:]]
