"""`VLLMServerEngine`: a client of one or several vLLM OpenAI-compatible servers.

Requests go to `/v1/completions` with token-id prompts, `return_token_ids` and the sampled
tokens' logprobs; each server batches concurrent requests itself. Start the servers with
`--logprobs-mode processed_logprobs` so the logprobs are those of the sampling distribution
(and `--enable-prompt-tokens-details` to have their prefix-cache hits counted per request).

With several servers (a list of URLs, or one string of comma-separated URLs; a router in front
of several counts as one), an episode's turns stay on the server of its first turn while it is
healthy, new episodes go to the least-loaded one, and a server that stops answering is taken
out and put back when it answers again (`pool.py`, `routing.py`).

Weights reach every server as `weight_sync` says (`server_sync.py`): `"folder"` (the default)
writes them as safetensors into `weights_dir`, a folder every server can read (same machine or
shared storage), and has each server reload it through `POST /collective_rpc` (the servers run
with `VLLM_SERVER_DEV_MODE=1`); `"toolgym-gloo"` (CPUs) and `"nccl"` (GPUs) broadcast them
through vLLM's own weight-transfer API to servers started with the matching
`--weight-transfer-config`.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from toolgym.agents.engines.base import Completion, EngineCapabilities, GenerationRequest
from toolgym.agents.engines.http_json import Connected, ServerError, ServerGone, call_json
from toolgym.agents.engines.pool import Answer, ServerPool
from toolgym.agents.engines.server_sync import make_weight_sync

__all__ = ["ServerError", "ServerGone", "VLLMServerEngine"]


class VLLMServerEngine:
    """Generates through vLLM servers' `/v1/completions` with token-id prompts.

    Args:
        base_url: The server, e.g. `http://127.0.0.1:8000`, or several (a list, or one string
            of comma-separated URLs), all serving the same model.
        model: The served model name; by default the first one `/v1/models` lists.
        context_length: Defaults to the served model's `max_model_len`.
        weights_dir: Where `update_weights` writes weights for the servers to read
            (`weight_sync="folder"`); by default a temporary folder, removed by `close`.
        weight_sync: How servers get new weights: `"folder"`, `"toolgym-gloo"` or `"nccl"`
            (see `toolgym.agents.engines.server_sync`).
        timeout: Seconds to wait for one HTTP request.
        max_parallel: Requests in flight at once.
        sticky: Keep an episode's turns on one server (False: each request to the least
            loaded one).
        wait_for_server: Seconds a request waits for a healthy server when none is left,
            before its episode ends with `engine_error`.
        probe_interval: Seconds between health probes (of servers taken out, and of those
            with requests in flight).
        probe_timeout: Seconds a probe waits; a server with requests in flight that misses
            two in a row is taken out (it hangs) and its requests go to another server.
    """

    capabilities = EngineCapabilities(per_request=True)
    """The servers batch continuously (`submit`) and hold their own weights."""

    def __init__(
        self,
        base_url: str | Sequence[str] = "http://127.0.0.1:8000",
        model: str | None = None,
        context_length: int | None = None,
        weights_dir: str | None = None,
        timeout: float = 600.0,
        max_parallel: int = 64,
        sticky: bool = True,
        wait_for_server: float = 30.0,
        probe_interval: float = 1.0,
        probe_timeout: float = 5.0,
        weight_sync: str = "folder",
    ) -> None:
        urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
        self.timeout = timeout
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="toolgym-weights-"))
        self._owns_weights_dir = weights_dir is None  # a folder it made, it removes on close
        self.weight_sync = make_weight_sync(weight_sync, self.weights_dir, timeout)
        self.pool = ServerPool(
            [url.strip().rstrip("/") for url in urls if url.strip()],
            sync=self.weight_sync,
            forget=self.weight_sync.forget,
            sticky=sticky,
            probe_interval=probe_interval,
            probe_timeout=probe_timeout,
            wait_for_server=wait_for_server,
        )
        try:
            up = [server for server in self.pool.servers if server.up]
            if not up:
                raise ServerError(f"no server answers: {', '.join(urls)}")
            served = call_json(up[0].url, "GET", "/v1/models", timeout=timeout)["data"][0]
        except BaseException:
            self.pool.close()
            if self._owns_weights_dir:
                shutil.rmtree(self.weights_dir, ignore_errors=True)
            raise
        self.model = model or served["id"]
        self.context_length = int(context_length or served.get("max_model_len") or 4096)
        self._threads = ThreadPoolExecutor(max_parallel, thread_name_prefix="vllm-client")

    @property
    def base_url(self) -> str:
        """The first server's URL."""
        return self.pool.servers[0].url

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order (concurrent requests to the servers)."""
        return [future.result() for future in map(self.submit, requests)]

    def submit(self, request: GenerationRequest) -> Future[Completion]:
        """Send one request now (its server batches it continuously with the others in
        flight); its completion arrives on the future."""
        return self._threads.submit(self._complete, request)

    def _complete(self, request: GenerationRequest) -> Completion:
        sampling = request.sampling
        body = {
            "model": self.model,
            "prompt": request.prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop_token_ids": sampling.stop_token_ids,
            "stop": sampling.stop_strings or None,
            "include_stop_str_in_output": True,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed

        def send(url: str, connected: Connected) -> Answer[dict[str, Any]]:
            answer = call_json(url, "POST", "/v1/completions", body, self.timeout, connected)
            usage = answer.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            return answer, int(usage.get("prompt_tokens") or len(request.prompt_ids)), cached

        choice = self.pool.run(request.session, send)["choices"][0]
        ids = list(choice["token_ids"])
        logprobs = [float(lp) for lp in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise ServerError(f"the server returned {len(logprobs)} logprobs for {len(ids)} tokens")
        return Completion(
            ids, logprobs, "length" if choice.get("finish_reason") == "length" else "stop"
        )

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Give every server the new weights (`weight_sync`): requests in flight finish under
        the old weights first, new ones wait for every server to hold the new ones (no
        completion mixes two policies)."""
        state = (
            model_or_state_dict.state_dict()
            if hasattr(model_or_state_dict, "state_dict")
            else model_or_state_dict
        )
        self.pool.update(lambda: self.weight_sync.write(state))

    def add_server(self, url: str) -> bool:
        """Send requests to `url` too, once it answers and holds the current weights (given
        to it before its first request); whether it does now."""
        return self.pool.add(url.rstrip("/")).up

    def stats(self) -> dict[str, dict[str, int | bool | None]]:
        """Per server: up, requests in flight and answered, failures, prompt tokens and the
        prefix-cache hits among them (None where the server does not report them)."""
        return {server.url: server.figures() for server in self.pool.servers}

    def prefix_cache_metrics(self) -> dict[str, dict[str, float]]:
        """Per server that answers: vLLM's `prefix_cache_hits` and `prefix_cache_queries`
        counters in tokens (from `/metrics`; what it counted since it started)."""
        found: dict[str, dict[str, float]] = {}
        for server in self.pool.servers:
            try:
                text = _get_text(server.url + "/metrics", self.timeout)
            except OSError:
                continue
            found[server.url] = {name: _counter(text, f"prefix_cache_{name}") for name in COUNTED}
        return found

    def close(self) -> None:
        """Stop the client's threads (the servers keep running; they belong to their owner)
        and remove the weights folder if the engine made it."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
        if self._owns_weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)


COUNTED = ("hits", "queries")


def _counter(metrics: str, name: str) -> float:
    """The sum of a `vllm:<name>_total` counter over its label sets in Prometheus text."""
    pattern = rf"^vllm:{name}_total(?:\{{[^}}]*\}})? (\S+)$"
    return sum(float(value) for value in re.findall(pattern, metrics, re.MULTILINE))


def _get_text(url: str, timeout: float) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()
