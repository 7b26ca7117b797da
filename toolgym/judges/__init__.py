"""Rewards a model gives: a `Judge` (a reward function) asks a judge model, on any engine or any
OpenAI-compatible API (`toolgym.agents.chat_clients`, re-exported here), to score episodes
against a `Rubric` of weighted criteria (`rubric`), one episode at a time or a group's
episodes in one call (`judge`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.agents.chat_clients import ChatClient, EngineClient, OpenAIClient
    from toolgym.judges.judge import Judge, transcript
    from toolgym.judges.rubric import (
        Criterion,
        JudgeFailure,
        JudgeUnparseable,
        JudgeUnreachable,
        Rubric,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
