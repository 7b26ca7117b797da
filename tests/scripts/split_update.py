"""A warm-up, then one `Learner.update` of four scripted trajectories split unevenly over the
processes, then a checkpoint saved and loaded back; run by tests/test_algorithms/test_sharding.py in
one process, and in two under DDP and under FSDP2 (`accelerate launch`, gloo on the CPU).

    split_update.py OUTPUT MODEL_FOLDER [--compile-model]

With two processes, process 0 updates on trajectories 0-2 and process 1 on trajectory 3, in
micro-batches of one: three passes against one, which the learner evens out. Each process
writes `OUTPUT/rank<N>.json`: the float64 sum of every full weight tensor after the update
(`first`), after a second update (`second`), and after loading the checkpoint taken between
the two and making the second update again (`again`); and the updates' figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

from toolgym.agents.trajectory import Sample, Trajectory
from toolgym.algorithms import GRPOConfig, SFTConfig
from toolgym.algorithms.compiled_layers import decoder_layers
from toolgym.algorithms.learner import Learner
from toolgym.algorithms.sharding import full_weights
from toolgym.runtime.stages import StageClock
from toolgym.testing import tiny_tokenizer

ADVANTAGES = [0.8, -0.5, -0.3, 0.6]


def trajectories() -> list[Trajectory]:
    """Four episodes of different lengths, with observation spans and step rewards."""
    made = []
    for i, turns in enumerate([(5, 3, 6), (9,), (4, 2, 4, 2, 3), (7, 2, 5)]):
        sample = Sample(list(range(10 + i, 17 + i)))
        for j, n in enumerate(turns):
            ids = [(20 + 7 * i + 3 * j + k) % 100 for k in range(n)]
            sample.append(ids, sampled=j % 2 == 0, logprobs=[-1.5 - 0.1 * k for k in range(n)])
        end = len(sample.completion_ids) // 2
        made.append(Trajectory([sample], step_rewards=[{"end": end, "reward": 0.3 * i}]))
    return made


def fingerprint(learner: Learner) -> list[float]:
    """Per tensor, the float64 sum of the full weights (a collective under sharding)."""
    state = full_weights(learner.model) if learner.sharded else learner.policy.state_dict()
    return [float(t.detach().double().sum()) for t in state.values()]


def main(output: Path, model_folder: str, compile_model: bool) -> None:
    accelerator = Accelerator(cpu=True)  # before loading, as GRPOTrainer does: under FSDP
    # accelerate's RAM-efficient loading then gives the other processes zeros to start from
    tokenizer = tiny_tokenizer()
    config = GRPOConfig(
        output_dir=str(output),
        num_iterations=2,
        beta=0.1,
        step_rewards="tokens",
        micro_batch_size=1,
        max_grad_norm=0.05,  # the clipping is active: the gradient's scale matters
        learning_rate=1e-2,
        progress_bar=False,
        compile_model=compile_model,
    )
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float64)
    learner = Learner(model, config, accelerator, 0)
    rank, processes = accelerator.process_index, accelerator.num_processes
    mine = [0, 1, 2] if rank == 0 else [3]
    if processes == 1:
        mine = [0, 1, 2, 3]
    played = trajectories()

    def update() -> dict[str, float]:
        chosen = [played[i] for i in mine]
        advantages = torch.tensor([ADVANTAGES[i] for i in mine])
        return learner.update(chosen, advantages, torch.ones(len(mine), dtype=torch.bool), 4)

    # a warm-up first: the same SFT steps in every process (under FSDP2 on the sharded policy,
    # its gradients averaged), then the KL reference anchored to the warmed weights
    learner.warm_up(
        played, SFTConfig(epochs=2, batch_size=2, learning_rate=1e-2), None, StageClock()
    )
    figures = update()
    first = fingerprint(learner)
    learner.save(output / "checkpoint", tokenizer, step=1)
    update()
    second = fingerprint(learner)
    assert learner.load(output / "checkpoint") == 1
    reloaded = fingerprint(learner)
    update()
    record = {
        "processes": processes,
        "sharded": learner.sharded,
        "first": first,
        "reloaded": reloaded,
        "second": second,
        "again": fingerprint(learner),
        "grad_norm": figures["grad_norm"],
        "decoder_layers": len(decoder_layers(learner.policy)),
    }
    (output / f"rank{rank}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2], "--compile-model" in sys.argv)
