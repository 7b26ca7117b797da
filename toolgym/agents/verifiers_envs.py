"""verifiers environments in toolgym, and toolgym environments in verifiers, both unchanged.

[verifiers](https://pypi.org/project/verifiers/) (prime-rl's environments) writes an
environment as a class that owns its rollout loop: `vf.MultiTurnEnv.env_response(messages,
state)`, `vf.ToolEnv(tools=[...])`, stop conditions and a `vf.Rubric` of reward functions,
calling the model through an OpenAI-style client. Both directions keep each side's own code:

- **A verifiers environment trained or evaluated by toolgym**: `verifiers_rows(vf_env)` are
  the rows of its dataset, `verifiers_rollout(vf_env)` the rollout function. Each episode runs
  the verifiers environment's own `run_rollout` (its loop, its tools, its rubric) against an
  endpoint over the agent's engine (`toolgym.agents.program`), which records exactly the
  tokens the model saw and sampled; the reward is the rubric's, handed to the episode's
  `VerifiersEpisode`, which writes it (`get_reward`), with the rubric's metrics as
  `episode_metrics`:

      agent.run([VerifiersEpisode() for _ in rows], rows, rollout_fn=verifiers_rollout(vf_env))

- **A toolgym environment in verifiers**: `verifiers_environment(env_id, rows)` is a
  `vf.MultiTurnEnv` whose episodes are toolgym episodes: the tools' schemas are the
  environment's, each assistant turn's tool calls run through toolgym's stepping layer
  (validation, failures as tool messages), an answer without calls goes to `user_turn` /
  `final_answer`, the episode stops where toolgym's does, and the rubric's one reward function
  is the environment's `get_reward()`. verifiers' own `evaluate` / `generate` drive it.

Tested with verifiers 0.1.14, the newest release whose requirements fit toolgym's (0.3 pins
`mcp<2`, 0.4 `mcp==2.0.0`; toolgym's MCP support needs `mcp>=2.3`).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from toolgym.agents.program import program_rollout
from toolgym.agents.rollout import RolloutFn
from toolgym.envs.calls import EnvironmentBug, ToolCall
from toolgym.envs.core import Environment
from toolgym.envs.stepping import Stepper

ROW_KEYS = ("prompt", "example_id", "answer", "info", "task")
"""The columns of a verifiers dataset row that its rollouts read."""


class VerifiersEpisode(Environment):
    """The toolgym side of an episode a verifiers environment plays (`verifiers_rollout`): no
    tools of its own (the verifiers environment runs its tools in its own loop); it keeps the
    rollout's output and writes its rubric's reward."""

    def __init__(self) -> None:
        self.output: dict[str, Any] | None = None

    def reset(self, **row: Any) -> None:
        self.output = None

    def _record(self, output: dict[str, Any]) -> None:
        """The verifiers rollout's output (`reward`, `metrics`, `stop_condition`, ...)."""
        self.output = output
        self.reward = float(output.get("reward") or 0.0)
        self.done = True

    def get_reward(self) -> float | None:
        """The rubric's reward (None before the rollout ended)."""
        return None if self.output is None else self.reward

    def episode_metrics(self) -> dict[str, float]:
        """The rubric's metrics (verifiers' `num_turns`, `total_tool_calls`, each function's)."""
        metrics = (self.output or {}).get("metrics") or {}
        return {f"vf/{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def verifiers_rows(
    vf_env: Any, n: int = -1, split: str = "train", seed: int | None = None
) -> list[dict[str, Any]]:
    """The rows of a verifiers environment's dataset (`split="eval"`: its eval dataset), as
    its rollouts read them: `prompt` (chat messages), `example_id`, `answer`, `info` (as JSON
    text) and `task`."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    data = vf_env.get_dataset(n, seed) if split == "train" else vf_env.get_eval_dataset(n, seed)
    rows = []
    for source in data:
        row = {key: source[key] for key in ROW_KEYS if key in source}
        if isinstance(row.get("info"), dict):
            row["info"] = json.dumps(row["info"])
        rows.append(row)
    return rows


def verifiers_rollout(
    vf_env: Any, sampling_args: dict[str, Any] | None = None, timeout: float = 600.0
) -> RolloutFn:
    """A rollout function that plays each episode with `vf_env`'s own `run_rollout` against
    the agent's engine (see the module docstring). The run's temperature applies unless
    `sampling_args` sets one. An error verifiers records for the episode, or one its
    environment raises (its code's, not the model's), ends it `env_error`; an endpoint limit
    (turns, tokens) ends it as toolgym's own loop would."""
    from openai import AsyncOpenAI
    from verifiers.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    async def program(base_url: str, api_key: str, row: dict[str, Any], env: Any) -> None:
        episode = env.unwrapped if isinstance(env, Stepper) else env
        if not isinstance(episode, VerifiersEpisode):
            raise EnvironmentBug(
                f"verifiers_rollout plays VerifiersEpisode environments, not {type(episode)}"
            )
        openai = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        client = OpenAIChatCompletionsClient(openai)
        given = {key: row[key] for key in ROW_KEYS if key in row}
        try:
            output = await vf_env.run_rollout(given, client, "policy", dict(sampling_args or {}))
        except Exception as error:  # out of the verifiers environment's own code, not the model's
            raise EnvironmentBug(f"the verifiers environment raised {error!r}") from error
        finally:
            await openai.close()
        if output.get("error") is not None:
            raise EnvironmentBug(f"the verifiers environment failed: {output['error']}")
        episode._record(dict(output))

    return program_rollout(program, timeout=timeout)


def verifiers_environment(
    env: str | Callable[[], Stepper],
    rows: Sequence[dict[str, Any]],
    max_turns: int = 16,
    **vf_kwargs: Any,
) -> Any:
    """A `vf.MultiTurnEnv` whose episodes are toolgym episodes of `env` (a registered id, or a
    factory of fresh `Stepper`s), one per row of `rows` (each row's `prompt` opens the
    conversation; the whole row goes to `reset`). See the module docstring."""
    import verifiers as vf
    from datasets import Dataset

    from toolgym.registry import make

    def new_episode() -> Stepper:
        return make(env) if isinstance(env, str) else env()

    dataset = Dataset.from_list(
        [
            {"prompt": _messages(row.get("prompt")), "info": {"toolgym_row": json.dumps(row)}}
            for row in rows
        ]
    )
    rubric = vf.Rubric(funcs=[toolgym_reward])
    made = toolgym_env_class()(dataset=dataset, rubric=rubric, max_turns=max_turns, **vf_kwargs)
    made.new_episode = new_episode
    return made


def toolgym_reward(state: Any, **_: Any) -> float:
    """The rubric function of `verifiers_environment`: the toolgym environment's own reward."""
    value = state.get("toolgym_reward")
    if value is None and state.get("toolgym") is not None:
        value = state["toolgym"].get_reward()
    return float(value or 0.0)


@functools.cache
def toolgym_env_class() -> type:
    """The `vf.MultiTurnEnv` subclass whose episodes are toolgym episodes (made once, when
    verifiers is first needed); an instance plays fresh `Stepper`s from its `new_episode`."""
    import verifiers as vf

    class ToolgymEnv(vf.MultiTurnEnv):
        """A toolgym environment's episodes in verifiers' loop."""

        new_episode: Callable[[], Stepper]

        async def setup_state(self, state: Any) -> None:
            stepper = await asyncio.to_thread(self.new_episode)
            row = json.loads(state["info"]["toolgym_row"])
            first = await asyncio.to_thread(stepper.reset, **row)
            state["toolgym"] = stepper
            if first:
                state["prompt"] = [*state["prompt"], vf.UserMessage(content=first)]
            functions = [tool["function"] for tool in stepper.tools]  # vf.Tool's fields
            state["tool_defs"] = self._normalize_tool_defs(functions) or []

        async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
            stepper: Stepper = state["toolgym"]
            last = messages[-1]
            calls = getattr(last, "tool_calls", None) or []
            if not calls:
                answer = _text(getattr(last, "content", ""))
                follow = await asyncio.to_thread(stepper.user_turn, answer)
                if follow is None:
                    await asyncio.to_thread(stepper.final_answer, answer)
                    state["final_env_response"] = []
                    return []
                return [vf.UserMessage(content=follow)]
            # the arguments as the model sent them (JSON text): decoded and checked by toolgym,
            # a malformed call answered as the model's failure; the turn's calls in one step
            step = await stepper.astep([ToolCall(c.name, c.arguments, c.id) for c in calls])
            replies = [
                vf.ToolMessage(content=message["content"], tool_call_id=call.id)
                for message, call in zip(step.messages, calls, strict=True)
            ]
            if stepper.done or stepper.truncated:
                state["final_env_response"] = replies
            return replies

        @vf.cleanup
        async def close_episode(self, state: Any) -> None:
            stepper = state.get("toolgym")
            if stepper is not None:
                state["toolgym_reward"] = stepper.get_reward()
                stepper.close()

    return ToolgymEnv


def _messages(prompt: Any) -> list[dict[str, Any]]:
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(message) for message in prompt]


def _text(content: Any) -> str:
    """A message's content as text (verifiers may hold content parts)."""
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(getattr(part, "text", "") or "" for part in content)
