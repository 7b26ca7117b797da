"""Weights to vLLM servers through vLLM's own weight-transfer API, on CPUs too.

vLLM (0.32) receives weights on its RL routes (`/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights`, `/finish_weight_update`) through a *weight-transfer
engine* that its workers create from the server's `--weight-transfer-config`; the trainer
broadcasts the tensors over a process group it shares with the server's workers, while the
workers load them with vLLM's layerwise reload. vLLM ships engines for GPUs (`"nccl"`, CUDA
IPC). This module adds one that runs anywhere torch does: `"toolgym-gloo"`, the same
lifecycle over a gloo group on TCP, registered in vLLM's factories by a vLLM plugin (the
`vllm.general_plugins` entry point `toolgym`, which every vLLM process loads where toolgym is
installed). Start a server with it:

    python -m vllm.entrypoints.openai.api_server --model M \\
        --weight-transfer-config '{"backend": "toolgym-gloo"}'

and the trainer with `GRPOConfig(weight_sync="toolgym-gloo")`. `"nccl"` goes through vLLM's own
engines unchanged. Nothing here is written to disk, and trainer and server need no shared
filesystem (the `"folder"` sync needs one).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch

BACKEND = "toolgym-gloo"
"""The backend name servers and trainers use for the gloo engine."""

_PREFIX = "toolgym-weights"


def register() -> None:
    """Register the gloo engines in vLLM's worker and trainer factories (the plugin's entry
    point; safe to call more than once, and in every vLLM process)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "GlooWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, __name__, "GlooTrainerWeightTransferEngine"
        )


def local_address_towards(host: str, port: int) -> str:
    """This machine's address on the route to `host` (what the peer can reach us at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), port))  # UDP: no packet is sent
        return str(probe.getsockname()[0])


def open_group(
    master: str, port: int, rank: int, world_size: int, own_address: str, timeout: float
) -> tuple[Any, Any]:
    """A gloo process group of its own (not torch's default group), over a TCP store that
    rank 0 serves on `master:port`. Returns (group, store)."""
    from torch.distributed import TCPStore

    wait = timedelta(seconds=timeout)
    store = TCPStore(
        master, port, world_size, is_master=rank == 0, timeout=wait, wait_for_workers=False
    )
    return gloo_group(store, rank, world_size, own_address, timeout), store


def gloo_group(store: Any, rank: int, world_size: int, own_address: str, timeout: float) -> Any:
    """A gloo group over `store` (which rank 0 serves), on the interface of `own_address`."""
    from torch.distributed import PrefixStore, ProcessGroupGloo

    options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timedelta(seconds=timeout)
    options._devices = [ProcessGroupGloo.create_device(hostname=own_address)]
    return ProcessGroupGloo(PrefixStore(_PREFIX, store), rank, world_size, options)


def broadcast(group: Any, tensor: torch.Tensor) -> None:
    """Broadcast `tensor` from rank 0 of `group` (in place on the other ranks)."""
    from torch.distributed import BroadcastOptions

    options = BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


@dataclass
class GlooInitInfo:
    """What a server's workers need to join the trainer's group (worker side)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout: float = 300.0


@dataclass
class GlooUpdateInfo:
    """One round's parameters, in the order the trainer broadcasts them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                f"{len(self.dtype_names)}, {len(self.shapes)}"
            )


def _worker_engine_base() -> Any:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    return WeightTransferEngine


def _trainer_engine_base() -> tuple[Any, Any]:
    from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

    return TrainerInitInfo, TrainerWeightTransferEngine


class GlooWeightTransferEngine(_worker_engine_base()):  # type: ignore[misc]
    """Worker side: joins the trainer's gloo group, receives each parameter by broadcast and
    loads it through vLLM's layerwise reload (which redoes the CPU backend's repacking)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: Any = None
        self.store: Any = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the trainer's group as rank `rank_offset` + this worker's rank."""
        own = local_address_towards(init_info.master_address, init_info.master_port)
        rank = init_info.rank_offset + self.parallel_config.rank
        self.group, self.store = open_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            own,
            init_info.timeout,
        )

    def start_weight_update(self) -> None:
        """Begin a layerwise reload of the model."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        """Finish the layerwise reload (processes the loaded weights)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        """Receive the round's parameters one by one and load each."""
        if self.group is None:
            raise RuntimeError("the gloo weight transfer is not initialised: call init first")
        for name, dtype_name, shape in zip(
            update_info.names, update_info.dtype_names, update_info.shapes, strict=True
        ):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
            broadcast(self.group, weight)
            self.model.load_weights([(name, weight.to(self.device))])

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive one round (vLLM's base also synchronises an accelerator; none here)."""
        self.receive_weights(self.parse_update_info(update_info))

    def shutdown(self) -> None:
        """Leave the group."""
        self.group = self.store = None


_TrainerInitInfoBase, _TrainerEngineBase = _trainer_engine_base()


@dataclass
class GlooTrainerInitInfo(_TrainerInitInfoBase):  # type: ignore[misc,valid-type]
    """Trainer side: where the trainer serves the group's store, and the group's size
    (1 + the server's workers)."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    timeout: float = 300.0


class GlooTrainerWeightTransferEngine(_TrainerEngineBase):  # type: ignore[misc,valid-type]
    """Trainer side: rank 0 of a gloo group with one server's workers; each round starts an
    update on the server, broadcasts every parameter while the server receives them, and
    finishes the update (the shape of vLLM's own NCCL trainer engine)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group: Any = None
        self.store: Any = None

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: Any, source: Any = None
    ) -> GlooTrainerWeightTransferEngine:
        """Open the group (rank 0) while the server's workers join it."""
        if source is None:
            raise ValueError("the gloo weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        from torch.distributed import TCPStore

        # The store must listen before the server is told where it is: bind it first.
        listening = TCPStore(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            is_master=True,
            timeout=timedelta(seconds=init_info.timeout),
            wait_for_workers=False,
        )
        worker = GlooInitInfo(
            init_info.master_address, listening.port, 1, init_info.world_size, init_info.timeout
        )
        opened: dict[str, Any] = {}

        def join() -> None:
            try:
                opened["group"] = gloo_group(
                    listening,
                    0,
                    init_info.world_size,
                    init_info.master_address,
                    init_info.timeout,
                )
            except Exception as error:  # reported below
                opened["error"] = error

        # A daemon thread: if the server refuses, nothing waits for it at exit while it
        # waits out the group's timeout for workers that will not come.
        joining = threading.Thread(target=join, name="weight-transfer-join", daemon=True)
        joining.start()
        client.init_weight_transfer_engine(asdict(worker))  # returns once its workers joined
        joining.join(init_info.timeout)
        if "group" not in opened:
            raise RuntimeError(f"the server's workers did not join: {opened.get('error')}")
        engine.group, engine.store = opened["group"], listening
        return engine

    def send_weights(self) -> None:
        """One round: start, broadcast every parameter while the server receives, finish."""
        if not self.is_sender:
            for _ in self.source:  # stay in any trainer-side gather
                pass
            return
        meta = self.source.metadata()
        info = GlooUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        thread = ThreadPoolExecutor(max_workers=1)
        try:
            received = thread.submit(self.client.update_weights, asdict(info))
            for _name, tensor in self.source:
                if received.done():  # the server refused: do not wait for a peer gone
                    received.result()
                broadcast(self.group, tensor.detach().to("cpu").contiguous())
            received.result()
        finally:
            thread.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        """Leave the group."""
        self.group = self.store = None


def _weight_source_base() -> Any:
    from vllm.distributed.weight_transfer.base import WeightSource

    return WeightSource


class StateDictSource(_weight_source_base()):  # type: ignore[misc]
    """A `WeightSource` over a state dict with Hugging Face parameter names (what the trainer
    hands engines: LoRA adapters merged, tied weights once)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def metadata(self) -> list[Any]:
        """Name, dtype and shape of every tensor, in iteration order."""
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.state.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.state.items())
