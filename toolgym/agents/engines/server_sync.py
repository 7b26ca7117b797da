"""How `VLLMServerEngine` gives each server the current weights (`weight_sync`).

`"folder"` (the default) writes the weights once as safetensors into a folder every server
can read (its `policy/` subfolder; the same machine or shared storage) and has each server
reload them from there (`POST /collective_rpc`, which needs `VLLM_SERVER_DEV_MODE=1`).
`"toolgym-gloo"` and `"nccl"` go through vLLM's own weight-transfer API
(`weight_transfer.py`): nothing touches a disk, the trainer broadcasts each tensor to the
server's workers over a process group of their own (gloo on TCP, for CPUs; NCCL, for GPUs),
and the server must run with `--weight-transfer-config '{"backend": "<the same name>"}'`.
The choice is the user's, never made silently: a server started without the matching config
fails the first sync with a message that says so.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Protocol

import torch

from toolgym.agents.engines.http_json import ServerError, call_json

WEIGHT_SYNCS = ("folder", "toolgym-gloo", "nccl")
"""The names `weight_sync` takes."""

GROUP_TIMEOUT = 120.0
"""Seconds a transfer group waits for a peer (one tensor's broadcast, the workers joining)
before the sync fails: a server that refused mid-transfer costs at most this."""


class WeightSync(Protocol):
    """Gives one server (its URL) the weights last `write`-n; raises `ServerError`."""

    def write(self, state: dict[str, torch.Tensor]) -> None:
        """Hold (or store) the new weights, before any server is synced."""

    def __call__(self, url: str) -> None:
        """Sync the server at `url`."""

    def forget(self, url: str) -> None:
        """The server was taken out: whatever links it to the trainer is stale."""


def make_weight_sync(name: str, weights_dir: Path, timeout: float) -> WeightSync:
    """The `WeightSync` that `name` (one of `WEIGHT_SYNCS`) names."""
    if name == "folder":
        return FolderSync(weights_dir, timeout)
    if name in WEIGHT_SYNCS:
        return TransferSync(name, timeout)
    raise ValueError(f"unknown weight_sync {name!r}; one of {', '.join(WEIGHT_SYNCS)}")


class FolderSync:
    """Safetensors in a shared folder, reloaded by each server."""

    def __init__(self, folder: Path, timeout: float) -> None:
        self.folder, self.timeout = folder, timeout
        self.target = folder / "policy"
        """The subfolder the servers reload: only this file in it (a server reads every
        safetensors file of the folder it is given)."""
        self.target.mkdir(parents=True, exist_ok=True)

    def write(self, state: dict[str, torch.Tensor]) -> None:
        """Write `model.safetensors` into the folder."""
        from safetensors.torch import save_file

        # clone: tied parameters share storage, which safetensors refuses to write twice
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()}
        save_file(tensors, str(self.target / "model.safetensors"))

    def __call__(self, url: str) -> None:
        """Have the server reload the folder and drop its prompt cache (old weights' KV)."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.target)}}
        call_json(url, "POST", "/collective_rpc", body, self.timeout)
        call_json(url, "POST", "/reset_prefix_cache", timeout=self.timeout)

    def forget(self, url: str) -> None:
        """Nothing links a server to the folder."""


class TransferSync:
    """vLLM's weight-transfer API: one transfer group per server, opened at its first sync
    (and again after the server was taken out or a transfer failed)."""

    def __init__(self, backend: str, timeout: float) -> None:
        self.backend, self.timeout = backend, timeout
        self.state: dict[str, torch.Tensor] = {}
        self._links: dict[str, Any] = {}
        self._lock = threading.Lock()

    def write(self, state: dict[str, torch.Tensor]) -> None:
        """Hold the weights; each server's sync broadcasts them."""
        self.state = {name: t.detach() for name, t in state.items()}

    def __call__(self, url: str) -> None:
        """Broadcast the weights to the server's workers, generation paused meanwhile (its
        layers are half loaded between the update's start and finish), then drop its prompt
        cache."""
        call_json(url, "POST", "/pause?mode=wait", timeout=self.timeout)
        try:
            link = self._link(url)
            link.source.state = self.state
            link.send_weights()
        except ServerError:
            self.forget(url)
            raise
        except Exception as error:  # the transfer failed on either side: a fresh group next
            self.forget(url)
            raise ServerError(f"weight transfer to {url} failed: {error}") from error
        finally:
            call_json(url, "POST", "/resume", timeout=self.timeout)
        call_json(url, "POST", "/reset_prefix_cache", timeout=self.timeout)

    def forget(self, url: str) -> None:
        """Drop the server's group; the next sync opens a new one."""
        with self._lock:
            link = self._links.pop(url, None)
        if link is not None:
            link.shutdown()

    def _link(self, url: str) -> Any:
        with self._lock:
            if url in self._links:
                return self._links[url]
        link = self._open(url)
        with self._lock:
            self._links[url] = link
        return link

    def _open(self, url: str) -> Any:
        """Open a group of the trainer (rank 0) and the server's workers."""
        from urllib.parse import urlsplit

        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from toolgym.agents.engines import weight_transfer

        weight_transfer.register()
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        workers = call_json(url, "GET", "/get_world_size?include_dp=false", timeout=self.timeout)
        world_size = 1 + int(workers["world_size"] if isinstance(workers, dict) else workers)
        address = weight_transfer.local_address_towards(host, port)
        client = HTTPVLLMWeightSyncClient(url, timeout=self.timeout)
        source = weight_transfer.StateDictSource(self.state)
        if self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            info: Any = NCCLTrainerInitInfo(address, _free_port(address), world_size, rank=0)
        else:
            info = weight_transfer.GlooTrainerInitInfo(address, 0, world_size, self.timeout, rank=0)
        try:
            return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
        except Exception as error:
            raise ServerError(
                f"{url} did not open a {self.backend!r} weight transfer ({error}); start it "
                f'with --weight-transfer-config \'{{"backend": "{self.backend}"}}\''
            ) from error


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])
