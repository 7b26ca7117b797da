"""A running OpenEnv environment server as an environment: `toolgym.openenv(url, ...)`.

    env = toolgym.openenv("http://127.0.0.1:8000")              # or an openenv-core client
    toolgym.register("myorg/Echo-v0", env, dataset=env.dataset_builder)
    GRPOTrainer(model, env=env, train_dataset=rows)              # or the id

`toolgym.openenv` returns a factory (`OpenEnv`): each instance it makes is a `Stepper` over an
`OpenEnvExecutor`, which holds one session of the server (openenv-core's `GenericEnvClient`
over its WebSocket, `/ws`: one environment instance on the server per session, opened at the
first reset and reused by the instance's later episodes).

- **MCP tools.** A server whose action class is openenv-core's `CallToolAction` (an
  `MCPEnvironment`, OpenEnv's tool environments) has one toolgym tool per MCP tool it lists
  (name, description, input schema; `tools=` keeps those named), each call a `call_tool`
  step; results, errors and images as `toolgym.adapters.openenv_mcp` says. Found from
  `/schema` (`mcp=True`/`False` decides instead).
- **One tool** (any other server). An openenv-core server takes exactly one action class
  (`create_app(env, action_cls, observation_cls)`) and publishes its JSON schema at `/schema`;
  that schema is the tool's parameters (less the `metadata` field every `Action` has, which
  is not the model's to fill), its description the tool's description, and the tool is named
  `tool_name` (default: the class's name less `Action`, in snake case: `EchoAction` ->
  `echo`). An action
  class with several kinds (a `Literal` field) is one tool whose argument is an enum.
  Arguments are checked against the schema before the server sees them.
- **Observations** are tool messages: an observation with one field is that field's value
  (a string as it is), else its fields as JSON (`observation=f` renders it your way: `f(dict)
  -> str`; for MCP tools, the reset's only). The reset's observation is the first observation
  (appended to the prompt).
- **Reward and end**: every step's `reward` is kept; the episode's reward is their sum
  (`reward="last"`: the last one given), and None while the server has given none (OpenEnv's
  default: "no reward", left to the trainer's reward functions). `done` ends the episode.
- **Failures**: an action the server refuses (its validation) or a step that raises there is
  a tool failure (`tool_error`) carrying the server's message; a server that cannot be
  reached or closes the session ends the episode `env_error` (the next reset opens a new
  session). The server's `max_concurrent_envs` (openenv-core's default: 1) bounds the
  instances in use at once: past it a reset fails with the server's CAPACITY_REACHED.

A factory is not a class, so toolgym's sandboxes cannot hold it (the environment's code runs
in the server's process anyway: sandbox the server).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import re
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.adapters.mcp import MCPTool, _no_model, _unbound
from toolgym.adapters.mcp_session import submit
from toolgym.adapters.openenv_mcp import (
    call_action,
    call_result,
    http_request,
    listed_tools,
    mcp_action,
)
from toolgym.envs.calls import ToolCall, ToolResult
from toolgym.envs.rows import rows_builder
from toolgym.envs.stepping import Executor, Stepper
from toolgym.envs.tools import Tool, render_result

Observation = Callable[[dict[str, Any]], str]


def require_openenv() -> None:
    """ImportError naming what to install unless openenv-core's client is here."""
    try:
        from openenv.core import GenericEnvClient  # noqa: F401
    except ImportError:
        raise ImportError(
            "toolgym.openenv needs openenv-core (its client): pip install openenv-core"
        ) from None


def base_url(url_or_client: Any) -> str:
    """The server's http(s) base URL, from a URL (http or ws) or an openenv-core client."""
    client = getattr(url_or_client, "async_client", url_or_client)  # a SyncEnvClient
    if isinstance(client, str):
        url = client
    elif isinstance(getattr(client, "_ws_url", None), str):
        url = client._ws_url.removesuffix("/ws")
    else:
        raise TypeError(
            f"toolgym.openenv takes a server URL or an openenv-core client, not "
            f"{type(url_or_client).__name__}"
        )
    url = url.rstrip("/")
    if url.startswith(("ws://", "wss://")):
        url = "http" + url[2:]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"an OpenEnv server URL starts with http(s):// or ws(s)://: {url!r}")
    return url


@dataclass
class OpenEnv:
    """A factory of environments over one OpenEnv server (`toolgym.openenv`'s result; see the
    module docstring). Call it (`env()`, with field overrides) for a new instance; `register`
    and `GRPOTrainer(env=...)` call it for you."""

    url: str
    tool_name: str | None = None
    """The tool's name (default: from the action class's name)."""
    description: str | None = None
    """The tool's description (default: the action schema's)."""
    reward: str = "sum"
    """"sum" of the steps' rewards, or the "last" one given."""
    observation: Observation | None = None
    dataset: Any = None
    """Prompt rows (a list of dicts with `prompt` and the reset columns) or a builder
    `f(n, seed, **kwargs)`; `dataset_builder` hands it to `toolgym.register`."""
    max_turns: int | None = None
    timeout: float = 60.0
    """Seconds to connect, and for a reset or a step to answer."""
    mcp: bool | None = None
    """One tool per MCP tool (True), the action as one tool (False), or as `/schema` says."""
    tools: Sequence[str] | None = None
    """The MCP tools the model sees (default: all the server lists)."""
    _tools: dict[str, Tool] = field(default_factory=dict, repr=False, compare=False)
    _schema: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.reward not in ("sum", "last"):
            raise ValueError(f"reward must be 'sum' or 'last', not {self.reward!r}")

    def __call__(self, **overrides: Any) -> Stepper:
        """A new environment instance (its session opens at the first reset)."""
        spec = dataclasses.replace(self, **overrides, _tools={}, _schema={}) if overrides else self
        return Stepper(OpenEnvExecutor(spec))

    def tool_table(self) -> dict[str, Tool]:
        """The server's MCP tools, or the one tool from its action schema (read once per
        factory)."""
        if not self._tools:
            if self.is_mcp():
                self._tools.update(listed_tools(self.url, self.timeout, self.tools))
            else:
                tool = schema_tool(self.schema()["action"], self.tool_name, self.description)
                self._tools[tool.name] = tool
        return dict(self._tools)

    def is_mcp(self) -> bool:
        """Whether each MCP tool is a tool (`mcp`, else: the action is a `CallToolAction`)."""
        return self.mcp if self.mcp is not None else mcp_action(self.schema()["action"])

    def schema(self) -> dict[str, Any]:
        """The server's `/schema`: the action, observation and state JSON schemas (read once)."""
        if not self._schema:
            schema = http_request(f"{self.url}/schema")  # with the URL's token, if any
            with urllib.request.urlopen(schema, timeout=self.timeout) as answer:
                self._schema.update(json.load(answer))
        return dict(self._schema)

    def client(self) -> Any:
        """A new, unconnected openenv-core client of the server."""
        require_openenv()
        from openenv.core import GenericEnvClient

        return GenericEnvClient(
            base_url=self.url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout
        )

    @property
    def dataset_builder(self) -> Callable[..., Any] | None:
        """`dataset` as a registry builder `f(n, seed)` (rows drawn by seed), or None."""
        return rows_builder(self.dataset)

    def __repr__(self) -> str:
        return (
            f"toolgym.openenv({self.url!r}) (an OpenEnv server: a factory, not a class, so a "
            "toolgym sandbox cannot hold it; the environment runs in the server)"
        )


def openenv(
    url_or_client: Any,
    *,
    tool_name: str | None = None,
    description: str | None = None,
    reward: str = "sum",
    observation: Observation | None = None,
    dataset: Any = None,
    max_turns: int | None = None,
    timeout: float = 60.0,
    mcp: bool | None = None,
    tools: Sequence[str] | None = None,
) -> OpenEnv:
    """An environment factory over a running OpenEnv environment server.

    Args:
        url_or_client: The server's URL (`http://host:port`, or `ws://`), or an openenv-core
            client of it (`EchoEnv(base_url=...)`, sync or async): its URL is used, and each
            toolgym instance opens a session of its own.
        tool_name: The one tool's name (default: the action class's, less `Action`, snake
            case); not for MCP tools, which keep theirs.
        description: The one tool's description (default: the action schema's).
        reward: "sum" of the steps' rewards (default) or the "last" one given.
        observation: `f(observation: dict) -> str`, the tool message (default: see the module).
        dataset: Prompt rows or a builder `f(n, seed)` (see `OpenEnv.dataset_builder`).
        max_turns: The episode's turn limit.
        timeout: Seconds to connect, and for a reset or a step to answer.
        mcp: Present each MCP tool the server lists as a tool, each call a `call_tool` step
            (True), or the action as one tool (False); default: MCP tools when the server's
            action class is openenv-core's `CallToolAction` (see `toolgym.adapters.openenv_mcp`).
        tools: The MCP tools the model sees (default: all the server lists).
    """
    return OpenEnv(
        base_url(url_or_client),
        tool_name=tool_name,
        description=description,
        reward=reward,
        observation=observation,
        dataset=dataset,
        max_turns=max_turns,
        timeout=timeout,
        mcp=mcp,
        tools=tools,
    )


_open: weakref.WeakSet[OpenEnvExecutor] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # a session left open is closed before the shared loop goes
    for executor in list(_open):
        executor.close()


class OpenEnvExecutor(Executor):
    """The executor of one environment instance over an OpenEnv server (wrapped in a
    `Stepper` by `OpenEnv.__call__`): one session, the steps' rewards, `done`."""

    _not_forkable = (
        "an OpenEnv server offers no snapshot of its state, so its episodes cannot be copied"
    )

    reward_per_step = True
    """Each step reports its own reward (the `Stepper` reports the change per step)."""

    def __init__(self, spec: OpenEnv) -> None:
        self.spec = spec
        self.target: type = OpenEnvExecutor
        self.max_turns = spec.max_turns
        self.client: Any = None
        self.rewards: list[float] = []
        """The rewards the server gave in this episode (the reset's included), in order."""
        self._done = False

    def tool_table(self) -> dict[str, Tool]:
        """The server's one tool (`OpenEnv.tool_table`)."""
        return self.spec.tool_table()

    # -- the episode ---------------------------------------------------------------------------
    def reset(self, row: dict[str, Any]) -> str | None:
        kwargs = {k: v for k, v in row.items() if k != "prompt" and _jsonable(v)}
        if kwargs.get("seed") is None:
            kwargs.pop("seed", None)
        from websockets.exceptions import ConnectionClosed

        try:
            result = self._wait(self._client().reset(**kwargs))
        except ConnectionClosed:  # the session was lost (a server restart): a new one, once
            self.close()
            result = self._wait(self._client().reset(**kwargs))
        self.rewards, self._done = [], False
        self._note(result)
        return self._text(result.observation) or None

    def run(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        return self._result(call, self._wait(self._stepped(self._action(call, arguments))))

    async def arun(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        future = submit(self._stepped(self._action(call, arguments)))
        try:
            outcome = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise
        return self._result(call, outcome)

    def _action(self, call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any]:
        """The step's action: a `call_tool` of an MCP tool, else the one tool's arguments."""
        return call_action(call.name, arguments) if self.spec.is_mcp() else arguments

    async def _stepped(self, action: dict[str, Any]) -> Any:
        """The step's result, or the server's refusal (a RuntimeError, returned)."""
        client = self._client()
        if client._ws is None:
            raise RuntimeError("call reset() before calling the OpenEnv server's tool")
        try:
            return await client.step(action)
        except RuntimeError as error:  # "Server error: ... (code: ...)": the server answered
            if str(error).startswith("Server error:"):
                return error
            raise

    def _result(self, call: ToolCall, outcome: Any) -> ToolResult:
        if isinstance(outcome, Exception):
            message = str(outcome).removeprefix("Server error: ")
            return ToolResult(call, f"Error: {message}", "tool_error")
        self._note(outcome)
        if self.spec.is_mcp():
            return call_result(call, dict(outcome.observation or {}))
        return ToolResult(call, self._text(outcome.observation))

    def _note(self, result: Any) -> None:
        if result.reward is not None:
            self.rewards.append(float(result.reward))
        self._done = bool(result.done)

    def _text(self, observation: Any) -> str:
        if self.spec.observation is not None:
            return str(self.spec.observation(dict(observation or {})))
        return observation_text(observation)

    def _client(self) -> Any:
        if self.client is None:
            self.client = self.spec.client()
            _open.add(self)
        return self.client

    def _wait(self, coroutine: Any) -> Any:
        future = submit(coroutine)
        try:
            return future.result(self.spec.timeout + 5)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"the OpenEnv server at {self.spec.url} did not answer") from None

    # -- reward and the protocol's other hooks -------------------------------------------------
    def read_reward(self) -> float | None:
        """The sum (or the last) of the rewards given this episode; None if none was."""
        if not self.rewards:
            return None
        return self.rewards[-1] if self.spec.reward == "last" else sum(self.rewards)

    def done(self) -> bool:
        return self._done

    def close(self) -> None:
        client, self.client = self.client, None
        _open.discard(self)
        if client is not None:
            with contextlib.suppress(Exception):  # the server drops the session with the socket
                submit(client.close()).result(10)


def schema_tool(action: dict[str, Any], name: str | None, description: str | None) -> Tool:
    """The tool for an action JSON schema (its `metadata` field left out)."""
    parameters = dict(action)
    title = str(parameters.pop("title", "") or "action")
    properties = dict(parameters.get("properties") or {})
    properties.pop("metadata", None)
    parameters["properties"] = properties
    if "required" in parameters:
        parameters["required"] = [p for p in parameters["required"] if p != "metadata"]
    parameters.setdefault("type", "object")
    name = name or _snake(title.removesuffix("Action")) or "act"
    text = description or parameters.pop("description", None) or f"Take a {title}."
    parameters.pop("description", None)
    schema = {
        "type": "function",
        "function": {"name": name, "description": text, "parameters": parameters},
    }
    return MCPTool(name=name, function=_unbound, schema=schema, arguments_model=_no_model())


def observation_text(observation: Any) -> str:
    """An observation (its fields, less reward, done and metadata) as message text: the
    value of its only field, else its fields as JSON."""
    if isinstance(observation, dict) and len(observation) == 1:
        (observation,) = observation.values()
    if observation is None or observation == {}:
        return ""
    return render_result(observation)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
