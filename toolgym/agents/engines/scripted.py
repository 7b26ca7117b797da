"""`ScriptedEngine`: returns given token sequences, for deterministic tests and examples."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal

from toolgym.agents.engines.base import Completion, GenerationRequest, first_stop_string_end

Script = Callable[[list[int]], list[int]]


class ScriptedEngine:
    """An engine whose "model" is a script: a list of replies used in turn, or a function.

    Args:
        replies: Token-id replies handed out in order (cycling), or `f(prompt_ids) -> ids`.
        context_length: The context length it claims.
        tokenizer: Decodes replies for `stop_strings` (requests with stop strings need it).
    """

    def __init__(
        self,
        replies: Iterable[list[int]] | Script,
        context_length: int = 4096,
        tokenizer: Any = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._script = replies if callable(replies) else None
        self._replies = [] if callable(replies) else [list(r) for r in replies]
        self._next = 0
        self._lock = threading.Lock()
        self.context_length = context_length
        self.batches: list[int] = []  # size of every generate() call, for tests of batching
        self.weights_version = 0
        """`update_weights` calls so far (stamped on each completion's `versions`)."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """The scripted token sequences, one per request, in order."""
        self.batches.append(len(requests))
        return [self._complete(request) for request in requests]

    def _complete(self, request: GenerationRequest) -> Completion:
        reply = self._script(request.prompt_ids) if self._script else self._take()
        ids = reply[: request.sampling.max_tokens]
        stops = set(request.sampling.stop_token_ids)
        end = next((i + 1 for i, token in enumerate(ids) if token in stops), None)
        if request.sampling.stop_strings:
            if self.tokenizer is None:
                raise ValueError("ScriptedEngine needs a tokenizer for stop strings")
            decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
            end = first_stop_string_end(ids[:end], request.sampling.stop_strings, decode) or end
        version = self.weights_version
        if end is not None:
            return Completion(ids[:end], [0.0] * end, "stop", [version] * end)
        reason: Literal["stop", "length"] = "length" if len(reply) > len(ids) else "stop"
        return Completion(ids, [0.0] * len(ids), reason, [version] * len(ids))

    def _take(self) -> list[int]:
        with self._lock:
            reply = self._replies[self._next % len(self._replies)]
            self._next += 1
        return reply

    def update_weights(self, model_or_state_dict: Any) -> None:
        """A script has no weights; the update is counted (`weights_version`)."""
        self.weights_version += 1

    def close(self) -> None:
        """Nothing to release."""
