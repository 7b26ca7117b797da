"""What `toolgym train` adds for runs over several processes and machines.

The accelerate configs toolgym ships (`accelerate_configs/*.yaml`, printed by
`toolgym accelerate-config NAME` for `accelerate launch --config_file`), the check that
refuses FSDP settings toolgym does not honour, and the end-of-run check that every
process holds the same weights.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Any

from toolgym.cli.errors import CLIError

CONFIG_DIR = Path(__file__).parent / "accelerate_configs"
"""The shipped accelerate config files, one `NAME.yaml` each."""


def config_names() -> list[str]:
    """The names of the shipped accelerate configs (file names without `.yaml`)."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.yaml"))


def config_path(name: str) -> Path:
    """The file of the shipped accelerate config `name` (e.g. "multi-node-ddp")."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise CLIError(f"no shipped accelerate config {name!r}; there are: {config_names()}")
    return path


def add_accelerate_config_command(commands: Any) -> None:
    """The `accelerate-config` subcommand."""
    parser = commands.add_parser(
        "accelerate-config",
        help="the path of a shipped accelerate config (multi-node DDP, FSDP2)",
        description="Print the path of a shipped accelerate config file, for "
        '`accelerate launch --config_file "$(toolgym accelerate-config NAME)" '
        "--machine_rank R -m toolgym train ...`; without NAME, list them. Copy one to edit "
        "it: the fields a user sets are commented in each file.",
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help=f"one of {config_names()}")
    parser.set_defaults(handler=_print_config)


def _print_config(args: argparse.Namespace) -> int:
    if args.name:
        print(config_path(args.name))
    else:
        for name in config_names():
            print(f"{name:20} {config_path(name)}")
    return 0


def refuse_fsdp() -> None:
    """Stop a process that `accelerate launch` started with FSDP settings toolgym does not
    honour (FSDP1, parameter offload, accelerate's activation checkpointing), before anything
    is loaded, with the reason (`toolgym.algorithms.sharding.check_fsdp_launch`)."""
    from toolgym.algorithms.sharding import ShardingError, check_fsdp_launch

    try:
        check_fsdp_launch()
    except ShardingError as error:
        raise CLIError(str(error)) from None


def weights_fingerprint(model: Any) -> list[float]:
    """One float64 sum per parameter tensor of `model`, computed where the tensors are:
    processes that hold the same weights get the same list, bit for bit."""
    import torch

    with torch.no_grad():
        sums = [p.detach().double().sum() for p in model.parameters()]
        return torch.stack(sums).tolist() if sums else []


def weights_agree(trainer: Any) -> tuple[bool, str] | None:
    """Whether every process of a run holds the same policy weights, and the line that says
    so (`compare_fingerprints`), in the main process (None in the others, which only send
    their `weights_fingerprint`). Every process must call it. Under FSDP2 there is one copy,
    split over the processes: the line says so and nothing is compared.

    The fingerprints go through the process group's key-value store, not a gloo collective:
    a collective's tensors, released by gloo's worker thread just as the process tears its
    group down, deadlock the interpreter's exit (torch 2.13: the group's destructor joins that
    thread while holding the GIL the thread waits for)."""
    import json

    from torch.distributed.distributed_c10d import _get_default_store

    accelerator = trainer.accelerator
    if trainer.learner.sharded:  # one copy, split over the processes: nothing to compare
        count = accelerator.num_processes
        line = f"weights sharded over {count} processes (FSDP2): one copy, nothing to compare"
        return (True, line) if accelerator.is_main_process else None
    store = _get_default_store()
    mine = weights_fingerprint(trainer.learner.policy)
    store.set(f"toolgym/weights/{accelerator.process_index}", json.dumps(mine))
    if not accelerator.is_main_process:
        return None
    keys = [f"toolgym/weights/{rank}" for rank in range(accelerator.num_processes)]
    return compare_fingerprints([json.loads(store.get(key)) for key in keys])


def compare_fingerprints(everyone: list[list[float]]) -> tuple[bool, str]:
    """Whether the processes' fingerprints (in process order) are all equal, and the line:
    `weights agree on N processes: yes (fingerprint ...)`, or `no` with the processes and
    the number of tensors that differ from process 0's."""
    count, first = len(everyone), everyone[0]
    differing = {
        rank: sum(a != b for a, b in zip(theirs, first, strict=True))
        for rank, theirs in enumerate(everyone)
        if theirs != first
    }
    if not differing:
        digest = hashlib.sha256(repr(first).encode()).hexdigest()[:12]
        return True, f"weights agree on {count} processes: yes (fingerprint {digest})"
    where = ", ".join(
        f"process {rank} in {n} of {len(first)} tensors" for rank, n in differing.items()
    )
    return False, f"weights agree on {count} processes: no (they differ from process 0's: {where})"
