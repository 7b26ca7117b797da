"""OpenEnv's MCP-style environments through `toolgym.openenv`: one toolgym tool per MCP tool.

An OpenEnv server whose action class is openenv-core's `CallToolAction` (an `MCPEnvironment`
served as `create_app(Env, CallToolAction, CallToolObservation)`, OpenEnv's pattern for tool
environments) takes `{"type": "call_tool", "tool_name": ..., "arguments": {...}}` and lists its
tools for `{"type": "list_tools"}`. `toolgym.openenv` recognises the schema (`mcp_action`) and
presents each listed tool as a toolgym tool of its own (`listed_tools`: its name, description
and input schema), each call a `call_tool` step (`call_action`) whose observation becomes the
tool message (`call_result`). The tools are listed once per factory over HTTP (`POST /step`,
a throwaway instance on the server, no session), or over `POST /mcp` (`tools/list`) where
`/step` refuses `list_tools` (a subclass of `CallToolAction`, or a production-mode server).

Results: an MCP result's text blocks joined by newlines (a resource's text; its structured
content as JSON when it has no blocks); with image blocks, the text and images in order
(`tools.image_blocks`: the message's `content_blocks`, for models that see images); a result
with `is_error` is a `tool_error`. The
server's named errors (`CallToolObservation.error`) are failures naming their type:
`tool_not_found` -> `unknown_tool`, `invalid_args` -> `invalid_arguments`, the others
(`execution_error`, `timeout`, `transport_error`) -> `tool_error`.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.adapters.mcp import MCPTool, _no_model, _unbound
from toolgym.envs.calls import FailureKind, ToolCall, ToolResult
from toolgym.envs.tools import blocks_text, image_blocks, render_result

FAILURES: dict[str, FailureKind] = {
    "tool_not_found": "unknown_tool",
    "invalid_args": "invalid_arguments",
}
"""The toolgym failure of each OpenEnv `ToolErrorType` not a `tool_error`."""


class OpenEnvToolsError(RuntimeError):
    """An MCP-style OpenEnv server whose tools cannot be listed (or that lists none)."""


def mcp_action(action: Mapping[str, Any]) -> bool:
    """Whether an action JSON schema (the server's `/schema` `action`) is openenv-core's
    `CallToolAction` or a subclass of it: `tool_name` and `arguments`, type `call_tool`."""
    properties = action.get("properties") or {}
    kind = properties.get("type") or {}
    return (
        "tool_name" in properties
        and "arguments" in properties
        and "call_tool" in (kind.get("const"), kind.get("default"))
    )


def call_action(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The OpenEnv action that calls the MCP tool `name`."""
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def listed_tools(url: str, timeout: float, only: Sequence[str] | None = None) -> dict[str, MCPTool]:
    """The server's MCP tools as toolgym tools (those named in `only`, when given, in the
    server's order); OpenEnvToolsError naming the server when it lists none."""
    listing = _listing(url, timeout)
    tools = {entry["name"]: listed_tool(entry) for entry in listing}
    if only is not None:
        missing = [name for name in only if name not in tools]
        if missing:
            raise OpenEnvToolsError(
                f"the OpenEnv server at {url} has no tool {missing[0]!r}; it lists "
                f"{', '.join(tools) or 'none'}"
            )
        tools = {name: tool for name, tool in tools.items() if name in only}
    if not tools:
        raise OpenEnvToolsError(f"the OpenEnv server at {url} takes MCP actions but lists no tools")
    return tools


def listed_tool(entry: Mapping[str, Any]) -> MCPTool:
    """A toolgym tool from one listed MCP tool (`name`, `description`, `input_schema` or
    `inputSchema`); arguments are checked against its schema before a step is sent."""
    name = str(entry["name"])
    schema = entry.get("input_schema") or entry.get("inputSchema") or {"type": "object"}
    parameters = dict(schema)
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    function = {"name": name, "description": entry.get("description") or name}
    schema = {"type": "function", "function": {**function, "parameters": parameters}}
    return MCPTool(name=name, function=_unbound, schema=schema, arguments_model=_no_model())


def call_result(call: ToolCall, observation: Mapping[str, Any]) -> ToolResult:
    """A `CallToolObservation` (as the client parses it: a dict) as the call's result."""
    error = observation.get("error")
    if error:
        kind = str(error.get("error_type") or "execution_error")
        message = f"Error ({kind}): {error.get('message') or 'the tool failed'}"
        return ToolResult(call, message, FAILURES.get(kind, "tool_error"))
    result = observation.get("result")
    if isinstance(result, Mapping) and isinstance(result.get("content"), list):
        failed = result.get("is_error") or result.get("isError")
        blocks = None if failed else image_blocks([_block(b) for b in result["content"]])
        if blocks is not None:
            return ToolResult(call, blocks_text(blocks), blocks=blocks)  # images: data URLs
        text = _content_text(result)
        if result.get("is_error") or result.get("isError"):
            if not text.lower().startswith("error"):
                text = f"Error: {text or 'the tool failed'}"
            return ToolResult(call, text, "tool_error")
        return ToolResult(call, text)
    return ToolResult(call, "" if result is None else render_result(result))


def _content_text(result: Mapping[str, Any]) -> str:
    """An MCP result's blocks as text (a media block raises `UnrenderableResult`)."""
    blocks = [_block(block) for block in result["content"]]
    structured = result.get("structured_content", result.get("structuredContent"))
    if not blocks:
        return "" if structured is None else render_result(structured)
    return render_result(blocks)


def _block(block: Any) -> Any:
    """A resource block as a text block (its text, else its URI); other blocks as they are."""
    if not isinstance(block, Mapping) or block.get("type") not in ("resource", "resource_link"):
        return block
    resource = block.get("resource") or block
    text = resource.get("text")
    return {
        "type": "text",
        "text": text if text is not None else f"[resource {resource.get('uri')}]",
    }


def _listing(url: str, timeout: float) -> list[dict[str, Any]]:
    """The server's tool list: a `list_tools` step over HTTP, else MCP's `tools/list`."""
    try:
        answer = _post(f"{url}/step", {"action": {"type": "list_tools"}}, timeout)
        tools = (answer.get("observation") or {}).get("tools")
        if tools:
            return list(tools)
    except urllib.error.HTTPError:
        pass  # /step refuses list_tools (an action subclass) or is not served (production)
    request = {"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1}
    try:
        answer = _post(f"{url}/mcp", request, timeout)
    except urllib.error.HTTPError as error:
        raise OpenEnvToolsError(
            f"the OpenEnv server at {url} takes MCP actions but listing its tools failed: "
            f"HTTP {error.code} from /step and /mcp"
        ) from None
    if "error" in answer:
        message = (answer["error"] or {}).get("message")
        raise OpenEnvToolsError(f"the OpenEnv server at {url} could not list its tools: {message}")
    return list((answer.get("result") or {}).get("tools") or [])


def http_request(url: str, body: dict[str, Any] | None = None) -> urllib.request.Request:
    """A GET of `url`, or a JSON POST of `body`; a user and password in the URL (as in
    `http://toolgym:TOKEN@host:port`, which `toolgym serve` prints) travel as Basic
    authentication, as openenv-core's WebSocket client sends them (urllib does not)."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = (
            "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        )
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(url, data, headers)


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = http_request(url, body)
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return dict(json.load(answer))
