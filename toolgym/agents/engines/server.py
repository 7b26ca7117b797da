"""`VLLMServerEngine`: a client of a running vLLM OpenAI-compatible server.

Requests go to `/v1/completions` with token-id prompts, `return_token_ids` and the sampled
tokens' logprobs; the server batches concurrent requests itself. Start the server with
`--logprobs-mode processed_logprobs` so the logprobs are those of the sampling distribution.

Weights are updated over HTTP: the client writes them as safetensors into `weights_dir`, a
folder the server can read too (same machine or shared storage), and calls the server's
`POST /collective_rpc` with `reload_weights(weights_path=...)`; the server must run with
`VLLM_SERVER_DEV_MODE=1` for that route to exist.
"""

from __future__ import annotations

import json
import tempfile
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from toolgym.agents.engines.base import Completion, EngineCapabilities, GenerationRequest


class ServerError(RuntimeError):
    """The server answered with an error or could not be reached."""


class VLLMServerEngine:
    """Generates through a vLLM server's `/v1/completions` with token-id prompts.

    Args:
        base_url: The server, e.g. `http://127.0.0.1:8000`.
        model: The served model name; by default the first one `/v1/models` lists.
        context_length: Defaults to the served model's `max_model_len`.
        weights_dir: Where `update_weights` writes weights for the server to read.
        timeout: Seconds to wait for one HTTP request.
        max_parallel: Requests in flight at once.
    """

    capabilities = EngineCapabilities(per_request=True)
    """The server batches continuously (`submit`) and holds its own weights."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        model: str | None = None,
        context_length: int | None = None,
        weights_dir: str | None = None,
        timeout: float = 600.0,
        max_parallel: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        served = self._call("GET", "/v1/models")["data"][0]
        self.model = model or served["id"]
        self.context_length = int(context_length or served.get("max_model_len") or 4096)
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="toolgym-weights-"))
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="vllm-client")
        self._update_lock = threading.Lock()
        self._gate = threading.Condition()  # requests in flight vs a weight update
        self._in_flight = 0
        self._updating = False

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in order (concurrent requests to the server)."""
        return [future.result() for future in map(self.submit, requests)]

    def submit(self, request: GenerationRequest) -> Future[Completion]:
        """Send one request now (the server batches it continuously with the others in
        flight); its completion arrives on the future."""
        return self._pool.submit(self._gated, request)

    def _gated(self, request: GenerationRequest) -> Completion:
        with self._gate:
            while self._updating:
                self._gate.wait()
            self._in_flight += 1
        try:
            return self._complete(request)
        finally:
            with self._gate:
                self._in_flight -= 1
                self._gate.notify_all()

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
        choice = self._call("POST", "/v1/completions", body)["choices"][0]
        ids = list(choice["token_ids"])
        logprobs = [float(lp) for lp in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise ServerError(f"the server returned {len(logprobs)} logprobs for {len(ids)} tokens")
        return Completion(
            ids, logprobs, "length" if choice.get("finish_reason") == "length" else "stop"
        )

    def update_weights(self, model_or_state_dict: Any) -> None:
        """Write the weights to `weights_dir` and have the server reload them from there."""
        state = (
            model_or_state_dict.state_dict()
            if hasattr(model_or_state_dict, "state_dict")
            else model_or_state_dict
        )
        # clone: tied parameters share storage, which safetensors refuses to write twice
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()}
        # The rule for requests in flight: new ones wait, running ones finish under the old
        # weights, then the weights change (no completion mixes two policies).
        with self._gate:
            self._updating = True
            while self._in_flight:
                self._gate.wait()
        try:
            self._reload(tensors)
        finally:
            with self._gate:
                self._updating = False
                self._gate.notify_all()

    def _reload(self, tensors: dict[str, Any]) -> None:
        from safetensors.torch import save_file

        with self._update_lock:
            save_file(tensors, str(self.weights_dir / "model.safetensors"))
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir)}}
            self._call("POST", "/collective_rpc", body)
            self._call("POST", "/reset_prefix_cache")  # KV cached under the old weights

    def close(self) -> None:
        """Stop the client's threads (the server keeps running; it belongs to its owner)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            hint = (
                " (start the server with VLLM_SERVER_DEV_MODE=1)"
                if path == "/collective_rpc" and error.code == 404
                else ""
            )
            raise ServerError(f"{method} {path} -> HTTP {error.code}: {detail}{hint}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise ServerError(f"{method} {path}: cannot reach {self.base_url}: {error}") from None
        return json.loads(payload) if payload else None
