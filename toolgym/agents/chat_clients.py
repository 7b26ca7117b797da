"""A model that answers a chat with text, for the parts of a run that ask one a question of
their own (a judge, a simulated user): any toolgym engine (the policy's own, another local
model, vLLM in-process or vLLM servers: `EngineClient`) or any OpenAI-compatible chat API
(`OpenAIClient`). The text it is asked about may be the policy's (a judged episode, the
conversation a user answers): turn markers in it are defused (`defuse`) so that it stays
text."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Protocol

from toolgym.agents.engines.base import Engine, GenerationRequest, SamplingParams
from toolgym.envs.calls import EnvironmentFailure

Messages = list[dict[str, str]]


COMMON_MARKERS = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|</?s>|\[/?INST\]|<(?:start|end)_of_turn>|</?think>|<\|?(?:im_start|im_end)\|?>"
)
"""The special-token texts of common chat templates (ChatML, Llama, Mistral, Gemma, ...): what
an API's server would read as turn markers in the text it is asked about."""


def defuse(text: str, markers: re.Pattern[str]) -> str:
    """`text` with every match of `markers` broken by a word joiner after its first character:
    it reads the same, and no tokenizer turns it into a special token (a judged episode could
    otherwise close its turn and write the judge's answer)."""
    return markers.sub(lambda match: match.group(0)[0] + "\u2060" + match.group(0)[1:], text)


def _special_texts(tokenizer: Any) -> re.Pattern[str]:
    """The tokenizer's special and added tokens' texts, as one pattern (longest first)."""
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        texts.update(added())
    texts = {t for t in texts if t}
    if not texts:
        return COMMON_MARKERS
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))


class ChatClientError(EnvironmentFailure):
    """The model could not answer (an engine error, an API that failed or refused): not the
    policy's doing."""


class ChatClient(Protocol):
    """A model that answers a chat with text."""

    name: str
    """Which model this is, for caches and records."""

    async def complete(self, messages: Messages) -> str:
        """The model's answer to `messages` (raise `ChatClientError` when there is none)."""
        ...


class EngineClient:
    """A chat client on a toolgym engine: the chat rendered by `tokenizer`'s chat template, one
    completion generated off the event loop (engines serialise their own use, so the
    policy's engine may answer between its rollouts).

    Args:
        engine: Any `Engine` (`HFEngine`, `VLLMEngine`, `VLLMServerEngine`, `ScriptedEngine`).
        tokenizer: The model's tokenizer.
        max_tokens: The most tokens of one answer.
        temperature: 0 answers greedily (the same chat gets the same answer).
        name: How records name this model (default: the engine's class).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        max_tokens: int = 256,
        temperature: float = 0.0,
        name: str | None = None,
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.max_tokens, self.temperature = max_tokens, temperature
        self.name = name or type(engine).__name__

    async def complete(self, messages: Messages) -> str:
        """The engine's answer to `messages`, rendered by the tokenizer's chat template."""
        markers = _special_texts(self.tokenizer)
        messages = [{**m, "content": defuse(m["content"], markers)} for m in messages]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding
            ids = ids["input_ids"]
        stops = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        sampling = SamplingParams(self.max_tokens, self.temperature, stop_token_ids=stops)
        request = GenerationRequest(list(ids), sampling, session=self.name)
        try:
            (completion,) = await asyncio.to_thread(self.engine.generate, [request])
        except Exception as error:
            raise ChatClientError(f"the engine failed: {error!r}") from error
        return str(self.tokenizer.decode(completion.token_ids, skip_special_tokens=True))


class OpenAIClient:
    """A chat client of any OpenAI-compatible chat completions API (a vLLM server, a hosted
    model), through the `openai` package (`pip install toolgym[judges]`).

    Args:
        base_url: The API's root (e.g. `http://127.0.0.1:8000/v1`).
        model: The model the API serves.
        api_key: Its key (default: `OPENAI_API_KEY`, else a placeholder for local servers).
        max_tokens: The most tokens of one answer.
        temperature: 0 answers greedily.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
    ) -> None:
        import os

        try:
            import openai
        except ImportError as error:
            raise ImportError(
                "OpenAIClient needs the openai package: pip install 'toolgym[judges]'"
            ) from error
        self._openai = openai
        self.base_url = base_url
        self._key = api_key or os.environ.get("OPENAI_API_KEY") or "local"
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.name = f"{model} at {base_url}"

    async def complete(self, messages: Messages) -> str:
        """The API's answer to `messages` (one chat completion)."""
        # a client per answer: each batch of rewards runs on an event loop of its own, and an
        # async HTTP client's connections belong to the loop that opened them; retries are
        # the caller's (its timeout bounds every try), none here
        client = self._openai.AsyncOpenAI(base_url=self.base_url, api_key=self._key, max_retries=0)
        messages = [{**m, "content": defuse(m["content"], COMMON_MARKERS)} for m in messages]
        try:
            async with client:
                reply = await client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                )
        except Exception as error:  # refused, unreachable, an HTTP error
            raise ChatClientError(f"the API failed: {error!r}") from error
        text = reply.choices[0].message.content if reply.choices else None
        if text is None:
            raise ChatClientError("the API answered with no text")
        return text
