"""One GRPO step on one process of `accelerate launch --multi_gpu --num_processes 2`, sampling
from vLLM servers shared by both processes, environments in process sandboxes; run by
tests/cluster_topology.py. Each process writes `<output>/rank<N>.json`: a checksum of its
weights after the step and its stage timings; process 0 also saves the policy to
`<output>/policy` (the trainer's side of the servers' comparison).

    cluster_grpo.py OUTPUT MODEL_FOLDER URL[,URL...]
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import toolgym
from toolgym.agents import AgentLimits
from toolgym.algorithms import GRPOConfig, GRPOTrainer


def completion_reward(prompts, completions, trajectories, **_):
    """Differs from rollout to rollout (it hashes the sampled tokens): a step that moves."""
    return [(sum(t.completion_ids) % 101) / 100 for t in trajectories]


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children of each of its threads, recursively)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            for child in map(int, children.read_text().split()):
                found += [child, *descendants(child)]
        except OSError:
            continue
    return found


def sandboxed(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # a worker runs toolgym/sandbox/boot.py (the process backend), or the worker module
    return b"toolgym/sandbox/boot.py" in command or b"toolgym.sandbox.worker" in command


def main(output: Path, model_folder: str, urls: str, weight_sync: str = "folder") -> None:
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder, torch_dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(output),
        max_steps=1,
        prompts_per_step=1,
        num_generations=4,
        micro_batch_size=2,
        limits=AgentLimits(max_turns=2, max_new_tokens=12, max_episode_tokens=400),
        parser="hermes",
        env_reward=False,
        learning_rate=1e-2,
        progress_bar=False,
        save_steps=0,
        engine="vllm-server",
        vllm_server_url=urls,
        weight_sync=weight_sync,  # type: ignore[arg-type]
        sandbox="process",
        distributed_timeout=120.0,
    )
    rows = list(toolgym.spec("Wordle-v0").dataset(4, seed=0))
    trainer = GRPOTrainer(
        model, "Wordle-v0", rows, reward_funcs=[completion_reward], args=args, tokenizer=tokenizer
    )
    synced: list[dict] = []  # each server reload this process asked for, timed
    pool = trainer.engine.pool
    reload = pool._sync

    def timed(url: str) -> None:
        began = time.perf_counter()
        reload(url)
        synced.append({"url": url, "seconds": time.perf_counter() - began})

    pool._sync = timed
    workers: set[int] = set()  # this process's sandbox workers (one per episode), polled
    training = threading.Event()
    training.set()

    def watch() -> None:
        while training.is_set():
            workers.update(pid for pid in descendants(os.getpid()) if sandboxed(pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        history = trainer.train()
    finally:
        training.clear()
        watcher.join()
    rank = trainer.accelerator.process_index
    policy = trainer.learner.policy
    weights = sum(float(p.detach().double().sum()) for p in policy.parameters())
    squares = sum(float(p.detach().double().square().sum()) for p in policy.parameters())
    if rank == 0:
        policy.save_pretrained(output / "policy")
    record = {
        "processes": trainer.accelerator.num_processes,
        "weights": weights,
        "squares": squares,
        "stages": trainer.stages.to_dict(),
        "metrics": {k: v for k, v in history[-1].items() if isinstance(v, (int, float))},
        "synced": synced,
        "workers": sorted(workers),
        "seconds": time.perf_counter() - started,
    }
    (output / f"rank{rank}.json").write_text(json.dumps(record, default=str))
    trainer.close()
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], *sys.argv[4:5])
