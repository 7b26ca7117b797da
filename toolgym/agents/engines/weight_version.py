"""The weights' version a vLLM server holds, by vLLM's own label (`/update_weight_version`,
`/weight_info`): a pool tags each server it syncs and checks the tag before trusting one
(a restarted server reports vLLM's "default" again)."""

from __future__ import annotations

import contextlib

from toolgym.agents.engines.http_json import ServerError, call_json


def label(version: int) -> str:
    """The label of a pool's weights version."""
    return f"toolgym-{version}"


def tag(url: str, version_label: str, timeout: float) -> None:
    """Tell the server which weights it now holds (a server without the route is not told:
    it will not be checked either)."""
    with contextlib.suppress(ServerError):
        call_json(url, "POST", "/update_weight_version", {"new_version": version_label}, timeout)


def reported_version(url: str, timeout: float) -> str | None:
    """The label the server reports; None where it cannot say (no such route, no answer)."""
    try:
        info = call_json(url, "GET", "/weight_info", timeout=timeout)
    except ServerError:
        return None
    return str(info["weight_version"]) if isinstance(info, dict) else None
