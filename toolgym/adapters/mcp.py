"""Any MCP server as an environment: `toolgym.mcp(server, ...)`.

    env = toolgym.mcp(["python", "my_server.py"], reward_tool="score")   # stdio, or a URL
    toolgym.register("myorg/Tools-v0", env, dataset=env.dataset_builder)
    GRPOTrainer(model, env=env, train_dataset=rows)                      # or the id

`toolgym.mcp` returns a factory (`MCP`): each instance it makes is a `Stepper` over an
`MCPExecutor`, the executor that talks to the server.

- **Tools** are the server's `tools/list` (names, descriptions and JSON schemas as they are),
  less the tools toolgym itself calls (`reset_tool`, `reward_tool`) and, with `tools=`, those
  not named. Arguments are checked against each tool's input schema before the server sees
  them (numbers sent as strings are coerced); the model reads what is wrong and the expected
  signature, as for any toolgym tool.
- **One session per episode.** `reset` starts a fresh session: a new server process for a
  command (stdio), a new session for a URL (streamable HTTP). A session opened only to list
  the tools is reused by the first reset (no tool ran in it).
- **Results** come back as tool messages: text blocks joined by newlines (a resource's text;
  other blocks as `[image image/png]`-style placeholders), else the structured content as
  JSON; a result with images also carries them as data URLs (`content_blocks`, for models
  that see images). A result with `isError` is a tool failure (`tool_error`) carrying the
  server's text, and so is a JSON-RPC error the server answers a call with. A server that
  exits during a call ends the episode `tool_crash` (the model's call killed it); one that
  cannot be reached ends it `env_error`.
- **Reward**: `reward_tool` (a server tool called when the reward is read, with the row's
  columns its schema names; its structured `result`, or its text, as a number), a `reward`
  function `reward(episode: MCPEpisode) -> float | None`, or both (their sum). With neither,
  the environment has no reward of its own (None: the trainer's reward functions score it).
- **reset_tool**: a server tool called at each reset with the row's columns its schema names
  (`seed` too); its text is the first observation (a failure there is `env_error`).

A factory is not a class, so toolgym's sandboxes (which import a class in a worker) cannot
hold it; a stdio server is a process of its own already: sandbox it by wrapping its command
(`bwrap ... python server.py`, `docker run -i ...`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from toolgym.adapters.mcp_session import MCPSession, Server, is_url, server_argv
from toolgym.envs.calls import ModelFailure, ToolCall, ToolResult
from toolgym.envs.rows import rows_builder
from toolgym.envs.stepping import Executor, Stepper
from toolgym.envs.tools import SchemaTool, Tool, image_blocks, render_result


class MCPServerGone(ModelFailure, RuntimeError):
    """The server's connection closed during one of the model's calls (a stdio server whose
    process exited): the episode ends `tool_crash`, the model's outcome, as when a call kills
    its sandbox worker (`toolgym.envs.stepping.failure_status`)."""


@dataclass
class MCPEpisode:
    """What a `reward` function sees of one episode.

    Attributes:
        row: The dataset row the episode was reset with (its `seed` included).
        calls: The model's tool calls that reached the server, as toolgym results, in order.
        answer: The model's final answer (its last message without tool calls), if any.
        session: The episode's open session; `episode.call(name, **arguments)` calls a tool.
    """

    row: dict[str, Any]
    calls: list[ToolResult] = field(default_factory=list)
    answer: str | None = None
    session: MCPSession | None = None

    def call(self, name: str, **arguments: Any) -> str:
        """Call one of the server's tools in this episode's session; its text (RuntimeError
        if the server reports an error)."""
        if self.session is None:
            raise RuntimeError("the episode has no open session")
        result = self.session.call(name, arguments, self.session.timeout)
        text = result_text(result)
        if result.is_error:
            raise RuntimeError(f"{name} failed: {text}")
        return text


RewardFunction = Callable[[MCPEpisode], "float | None"]


@dataclass
class MCP:
    """A factory of environments over one MCP server (`toolgym.mcp`'s result; see the module
    docstring). Call it (`env()`, with field overrides) for a new instance; `register` and
    `GRPOTrainer(env=...)` call it for you."""

    server: Server
    reward: RewardFunction | None = None
    dataset: Any = None
    """Prompt rows (a list of dicts with `prompt` and the reset columns) or a builder
    `f(n, seed, **kwargs)`; `dataset_builder` hands it to `toolgym.register`."""
    reward_tool: str | None = None
    reset_tool: str | None = None
    tools: Sequence[str] | None = None
    """The tools the model sees (default: all the server lists, less reset and reward)."""
    max_turns: int | None = None
    env: Mapping[str, str] | None = None
    """Extra environment variables for a command server."""
    cwd: str | None = None
    mode: str = "legacy"
    timeout: float = 60.0
    """Seconds for a server to start and answer, and for a reward or reset call."""
    errlog: TextIO | None = None
    _listing: list[Any] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not is_url(self.server):
            server_argv(self.server)  # an empty command fails here, not at the first reset

    def __call__(self, **overrides: Any) -> Stepper:
        """A new environment instance (its server starts at the first reset or tool listing)."""
        spec = self
        if overrides:
            fresh: dict[str, Any] = {"_listing": []} if "server" in overrides else {}
            spec = dataclasses.replace(self, **overrides, **fresh)
        return Stepper(MCPExecutor(spec))

    def session(self) -> MCPSession:
        """A new, unopened session with this server."""
        return MCPSession(
            self.server,
            env=self.env,
            cwd=self.cwd,
            mode=self.mode,
            timeout=self.timeout,
            errlog=self.errlog,
        )

    @property
    def dataset_builder(self) -> Callable[..., Any] | None:
        """`dataset` as a registry builder `f(n, seed)` (rows drawn by seed), or None."""
        return rows_builder(self.dataset)

    def __repr__(self) -> str:
        kind = "streamable HTTP" if is_url(self.server) else "stdio"
        return (
            f"toolgym.mcp({self.server!r}) (an MCP server over {kind}: a factory, not a class, "
            "so a toolgym sandbox cannot hold it; sandbox a stdio server by wrapping its "
            "command, e.g. ['bwrap', ..., 'python', 'server.py'])"
        )


def mcp(
    server: Server,
    *,
    reward: RewardFunction | None = None,
    dataset: Any = None,
    reward_tool: str | None = None,
    reset_tool: str | None = None,
    tools: Sequence[str] | None = None,
    max_turns: int | None = None,
    **options: Any,
) -> MCP:
    """An environment factory over the MCP server `server`: a URL (streamable HTTP) or a
    command (a list of argv, or a string split like a shell line) run over stdio.

    Args:
        server: Where the server is, or how to start it.
        reward: `f(episode: MCPEpisode) -> float | None`, called once the episode is over.
        dataset: Prompt rows or a builder `f(n, seed)` (see `MCP.dataset_builder`).
        reward_tool: A server tool whose result is the reward (hidden from the model).
        reset_tool: A server tool called at each reset; its text is the first observation.
        tools: Only these of the server's tools are shown to the model.
        max_turns: The episode's turn limit.
        **options: `env`, `cwd`, `mode` ("legacy" or "auto"), `timeout`, `errlog` (`MCP`).
    """
    return MCP(
        server,
        reward=reward,
        dataset=dataset,
        reward_tool=reward_tool,
        reset_tool=reset_tool,
        tools=tools,
        max_turns=max_turns,
        **options,
    )


class MCPExecutor(Executor):
    """The executor of one environment instance over an MCP server (wrapped in a `Stepper`
    by `MCP.__call__`): a session per episode, the server's tools, the reward sources."""

    _not_forkable = (
        "an MCP server offers no snapshot of its state, so its episodes cannot be copied"
    )

    def __init__(self, spec: MCP) -> None:
        self.spec = spec
        self.target: type = MCPExecutor
        self.max_turns = spec.max_turns
        self.session: MCPSession | None = None
        self.episode = MCPEpisode({})
        self._reward: tuple[float | None] | None = None
        self._tools: dict[str, MCPTool] | None = None

    # -- the episode ---------------------------------------------------------------------------
    def reset(self, row: dict[str, Any]) -> str | None:
        if self.session is None or self.session.used:
            self._close_session()
            self.session = self.spec.session().open()
        self.episode = MCPEpisode(dict(row), session=self.session)
        self._reward = None
        name = self.spec.reset_tool
        if name is None:
            return None
        result = self.session.call(name, self._columns(name, row), self.spec.timeout)
        if result.is_error:
            raise RuntimeError(f"the reset tool {name!r} failed: {result_text(result)}")
        return result_text(result) or None

    def tool_table(self) -> dict[str, Tool]:
        """The server's tools the model sees, listed once per factory (the first session)."""
        if self._tools is None:
            hidden = {self.spec.reset_tool, self.spec.reward_tool}
            shown = self.spec.tools
            self._tools = {
                tool.name: mcp_tool(tool)
                for tool in self._listing()
                if tool.name not in hidden and (shown is None or tool.name in shown)
            }
        return dict(self._tools)

    def _listing(self) -> list[Any]:
        if not self.spec._listing:
            if self.session is None:
                self.session = self.spec.session().open()  # kept: the first reset reuses it
            self.spec._listing.extend(self.session.list_tools())
        return self.spec._listing

    def _columns(self, name: str, row: Mapping[str, Any]) -> dict[str, Any]:
        """The row's columns that the server tool `name` takes (all, where its schema allows
        other properties)."""
        schema = next((t.input_schema for t in self._listing() if t.name == name), None)
        if schema is None:
            raise RuntimeError(f"the MCP server has no tool {name!r}")
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is True:
            return {k: v for k, v in row.items() if k != "prompt" and v is not None}
        return {k: v for k, v in row.items() if k in properties and v is not None}

    # -- calls ---------------------------------------------------------------------------------
    def run(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        from mcp import MCPError

        session = self._session()
        try:
            result = session.call(call.name, arguments)
        except MCPError as error:
            return self._refused(call, error)
        return self._record(as_tool_result(call, result))

    async def arun(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        from mcp import MCPError

        session = self._session()
        try:
            result = await session.acall(call.name, arguments)
        except MCPError as error:
            return self._refused(call, error)
        return self._record(as_tool_result(call, result))

    def _refused(self, call: ToolCall, error: Exception) -> ToolResult:
        """A JSON-RPC error answering a call: the server refused it (the model's mistake, a
        `tool_error`), or the connection closed while it ran (`MCPServerGone`)."""
        from mcp_types import CONNECTION_CLOSED

        if getattr(error, "code", None) == CONNECTION_CLOSED:
            raise MCPServerGone(f"the MCP server closed the connection during {call.name}")
        return self._record(ToolResult(call, f"Error: {error}", "tool_error"))

    def _record(self, result: ToolResult) -> ToolResult:
        self.episode.calls.append(result)
        self._reward = None
        return result

    def _session(self) -> MCPSession:
        if self.session is None:
            raise RuntimeError("call reset() before calling the MCP server's tools")
        return self.session

    # -- reward and the protocol's other hooks -------------------------------------------------
    def read_reward(self) -> float | None:
        """The reward tool's value plus the reward function's (None where neither is given
        or both report None), read once per state of the episode."""
        if self._reward is None:
            self._reward = (self._score(),)
        return self._reward[0]

    def _score(self) -> float | None:
        values: list[float | None] = []
        name = self.spec.reward_tool
        if name is not None and self.session is not None:
            columns = self._columns(name, self.episode.row)
            result = self.session.call(name, columns, self.spec.timeout)
            values.append(reward_value(name, result))
        if self.spec.reward is not None:
            value = self.spec.reward(self.episode)
            values.append(None if value is None else float(value))
        numbers = [v for v in values if v is not None]
        return sum(numbers) if numbers else None

    def final_answer(self, text: str) -> None:
        self.episode.answer = text
        self._reward = None

    def close(self) -> None:
        self._close_session()

    def _close_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()


class MCPTool(SchemaTool):
    """A server's tool: its schema as listed; arguments checked by JSON Schema."""


def mcp_tool(listed: Any) -> MCPTool:
    """A toolgym tool from an `mcp.types.Tool` (its name, description and input schema)."""
    parameters = dict(listed.input_schema or {"type": "object"})
    parameters.setdefault("properties", {})
    schema = {
        "type": "function",
        "function": {
            "name": listed.name,
            "description": listed.description or listed.title or listed.name,
            "parameters": parameters,
        },
    }
    return MCPTool(name=listed.name, function=_unbound, schema=schema, arguments_model=_no_model())


def as_tool_result(call: ToolCall, result: Any) -> ToolResult:
    """An MCP `CallToolResult` as a toolgym result (`isError`: a `tool_error` failure); one
    with images also carries them, as data URLs, for models that see them."""
    text = result_text(result)
    if result.is_error:
        if not text.lower().startswith("error"):  # the model reads "Error..." first, once
            text = f"Error: {text or 'the tool failed'}"
        return ToolResult(call, text, "tool_error")
    return ToolResult(call, text, blocks=result_blocks(result))


def result_text(result: Any) -> str:
    """A `CallToolResult`'s content as message text (see the module docstring)."""
    parts = [_block_text(block) for block in result.content or ()]
    if not parts and result.structured_content is not None:
        return render_result(result.structured_content)
    return render_result("\n".join(parts))


def result_blocks(result: Any) -> list[dict[str, str]] | None:
    """A `CallToolResult` with images as text and image blocks (`tools.image_blocks`); None
    without an image."""
    content = list(result.content or ())
    if not any(getattr(block, "type", "") == "image" for block in content):
        return None
    with contextlib.suppress(TypeError, ValueError):  # unreadable: the placeholder text only
        return image_blocks(
            [
                {"type": "image", "data": block.data, "mimeType": block.mime_type}
                if block.type == "image"
                else {"type": "text", "text": _block_text(block)}
                for block in content
            ]
        )
    return None


def _block_text(block: Any) -> str:
    """One content block as text: its text, a resource's text or URI, else a placeholder."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind == "resource" and getattr(block.resource, "text", None) is not None:
        return str(block.resource.text)
    if kind in ("resource", "resource_link"):
        return f"[resource {getattr(getattr(block, 'resource', block), 'uri', '')}]"
    return f"[{kind} {getattr(block, 'mime_type', '') or ''}]".replace(" ]", "]")


def reward_value(name: str, result: Any) -> float | None:
    """The number a reward tool returned: its structured `result` (or only value), else its
    text; an error result or a non-number is an error naming the tool."""
    text = result_text(result)
    if result.is_error:
        raise RuntimeError(f"the reward tool {name!r} failed: {text}")
    structured = result.structured_content
    if isinstance(structured, Mapping) and len(structured) == 1:
        value = next(iter(structured.values()))
    else:
        value = text.strip()
    if value is None or value == "null":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RuntimeError(f"the reward tool {name!r} returned {text!r}, not a number") from None


def _unbound(**arguments: Any) -> Any:
    raise RuntimeError("an MCP tool runs on its server, through MCPExecutor.run")


def _no_model() -> Any:
    import pydantic

    return pydantic.BaseModel
