"""Real vLLM servers for the tests and benches that need several (`Servers`: start, wait,
kill, restart on 127.0.0.1), and the probes that compare their policies (`greedy_on`,
`same_policy`, `decisive` and `perturbed` weights)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from toolgym.agents import GenerationRequest, SamplingParams
from toolgym.agents.engines.pool import call_json

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_alive(group: int) -> bool:
    """A process of `group` that is not a zombie."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


class Servers:
    """vLLM servers on 127.0.0.1, each in a process group of its own (the API server and its
    engine-core process), killed by group."""

    def __init__(self, model: Path, root: Path, context: int = 2048, options=()) -> None:
        self.model, self.root, self.context, self.options = model, root, context, list(options)
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, url: str | None = None) -> str:
        """Start a server (at `url`, or on a free port) without waiting for it."""
        url = url or f"http://127.0.0.1:{free_port()}"
        port = url.rsplit(":", 1)[1]
        environment = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "0",
            "OMP_NUM_THREADS": "1",
            "VLLM_CACHE_ROOT": str(self.root / "cache"),
            "TMPDIR": str(self.root),
        }
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
            "--host", "127.0.0.1", "--port", port, "--dtype", "float32",
            "--max-model-len", str(self.context),
            "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20), "--block-size", "32",
            "--distributed-executor-backend", "uni", "--logprobs-mode", "processed_logprobs",
            "--enable-prompt-tokens-details", *self.options,
        ]  # fmt: skip
        with open(self.root / f"server-{port}.log", "ab") as log:
            self.running[url] = subprocess.Popen(
                command, env=environment, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return url

    def wait(self, url: str, timeout: float = 240) -> None:
        """Until `url` answers `/health` and serves one token (fails with the server's log if
        it died). A server whose engine dies on that first token (vllm-cpu did so once in CI,
        before any weights moved) is restarted once, with a warning that carries its log."""
        self._wait_healthy(url, timeout)
        try:
            self._first_token(url)
        except Exception as error:  # any failure: restart once, then fail
            warnings.warn(
                f"the vLLM server at {url} failed its first token ({error}); restarted once. "
                f"Its log:\n{self.log_tail(url)}",
                stacklevel=2,
            )
            self.kill(url)
            self.start(url)
            self._wait_healthy(url, timeout)
            try:
                self._first_token(url)
            except Exception as again:
                pytest.fail(f"the vLLM server at {url} failed its first token twice ({again}):\n"
                            f"{self.log_tail(url)}")  # fmt: skip

    def _wait_healthy(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                return
            except OSError:
                if self.running[url].poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the vLLM server did not start:\n{self.log_tail(url)}")
                time.sleep(0.3)

    @staticmethod
    def _first_token(url: str) -> None:
        model = call_json(url, "GET", "/v1/models", timeout=120)["data"][0]["id"]
        body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0}
        call_json(url, "POST", "/v1/completions", body, timeout=120)

    def log_tail(self, url: str, chars: int = 6000) -> str:
        """The last `chars` characters of the log of the server at `url` (every start of it)."""
        log = self.root / f"server-{url.rsplit(':', 1)[1]}.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"

    def log_tails(self, chars: int = 4000) -> str:
        """The tails of every server log this launcher wrote (conftest adds them to a failing
        test's report)."""
        return "\n".join(
            f"--- {log.name} ---\n{log.read_text(errors='replace')[-chars:]}"
            for log in sorted(self.root.glob("server-*.log"))
        )

    def kill(self, url: str) -> None:
        """SIGKILL the server's whole process group and wait until none of it is left."""
        server = self.running.pop(url)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _group_alive(server.pid):
            assert time.monotonic() < deadline, f"processes of the server at {url} survived"
            time.sleep(0.1)

    def signal(self, url: str, number: signal.Signals) -> None:
        """Send `number` to the server's process group (SIGSTOP: it hangs; SIGCONT: back)."""
        os.killpg(self.running[url].pid, number)

    def close(self) -> None:
        for url in list(self.running):
            self.kill(url)


PROBE = list(range(40, 240))
"""A prompt of 200 token ids (plain characters of the tiny tokenizer)."""


def greedy(max_tokens: int, session: str | None = None) -> GenerationRequest:
    return GenerationRequest(PROBE, SamplingParams(max_tokens, temperature=0), session=session)


def greedy_on(url: str, max_tokens: int = 16) -> tuple[list[int], list[float]]:
    """Greedy ids and logprobs of the probe prompt, asked of one server directly."""
    body = {"prompt": PROBE, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0}
    body |= {"model": call_json(url, "GET", "/v1/models")["data"][0]["id"]}
    choice = call_json(url, "POST", "/v1/completions", body | {"return_token_ids": True})
    choice = choice["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def same_policy(first, second, tolerance: float = 1e-3) -> bool:
    """The same ids with the same logprobs (up to batch-size float noise)."""
    first_ids, first_lps = first if isinstance(first, tuple) else (first.token_ids, first.logprobs)
    ids, lps = second if isinstance(second, tuple) else (second.token_ids, second.logprobs)
    if ids != first_ids:
        return False
    return max(abs(x - y) for x, y in zip(lps, first_lps, strict=True)) < tolerance


def decisive(state: dict, tokenizer) -> dict:
    """Sharpen the output head (greedy choices far apart, so that float noise of other
    batch sizes hardly ever flips one) and give special tokens no score (no completion ends
    early at EOS): the long requests these tests hold in flight run to their length."""
    import torch

    with torch.no_grad():
        head = state["lm_head.weight"]
        head.mul_(1.0 / head.std())  # logits about N(0, 11)
        head[tokenizer.all_special_ids] = 0.0
    return state


def perturbed(model, tokenizer, seed: int) -> dict:
    """Other weights of the same shapes (another policy), as decisive as the first."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = {
        name: value + 0.5 * torch.randn(value.shape, generator=generator)
        for name, value in model.state_dict().items()
    }
    return decisive(state, tokenizer)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
