"""Where an environment instance lives: in this process, in a limited subprocess, or in a
Docker container, behind one surface (`RemoteEnvironment`).

    env = toolgym.make("PythonREPL-v0", sandbox="docker")   # or "process", "ray", "local", "auto"
    env.reset(seed=0)
    env.step(toolgym.ToolCall("run", {"code": "1 + 1"}))
    env.isolation      # what the sandbox actually got: network, filesystem, limits, user

This package's `__init__` stays light: the worker (`python -m toolgym.sandbox.worker`) imports
it inside minimal images. Backends load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolgym.envs.stepping import Stepper, as_environment

if TYPE_CHECKING:
    from toolgym.sandbox.remote import Backend

BACKENDS = ("local", "process", "docker", "ray", "auto")


def backend(name: str | Backend) -> Backend | None:
    """The backend called `name` (None for "local"); objects are returned as they are."""
    if not isinstance(name, str):
        return name
    if name == "local":
        return None
    if name == "process":
        from toolgym.sandbox.process import ProcessBackend

        return ProcessBackend()
    if name == "docker":
        from toolgym.sandbox.docker import DockerBackend

        return DockerBackend()
    if name == "ray":  # a Ray actor per instance: RAY_ADDRESS's cluster, else a local Ray
        from toolgym.sandbox.ray_backend import RayBackend

        return RayBackend()
    if name == "auto":
        return strongest_backend()
    raise ValueError(f"unknown sandbox {name!r}; expected one of {', '.join(BACKENDS)}")


def strongest_backend() -> Backend:
    """Docker when a daemon answers and the sandbox image is built, else the process backend."""
    from toolgym.sandbox.docker import DockerBackend, docker_ready
    from toolgym.sandbox.process import ProcessBackend

    return DockerBackend() if docker_ready() else ProcessBackend()


def sandboxed(
    target: type, kwargs: dict[str, Any] | None = None, where: str | Backend = "auto", **options
) -> Stepper:
    """An instance of the environment class `target` placed by `where` (see `backend`);
    `options` go to `RemoteEnvironment` (call_timeout, start_timeout)."""
    chosen = backend(where)
    if chosen is None:
        return as_environment(target(**(kwargs or {})))
    from toolgym.sandbox.remote import RemoteEnvironment

    return RemoteEnvironment(target, kwargs, backend=chosen, **options)


def __getattr__(name: str) -> Any:
    import importlib

    homes = {
        "RemoteEnvironment": "remote",
        "SandboxError": "remote",
        "SandboxTimeout": "remote",
        "RemoteError": "remote",
        "Isolation": "remote",
        "ProcessBackend": "process",
        "ProcessLimits": "process",
        "DockerBackend": "docker",
        "RayBackend": "ray_backend",
        "SandboxPool": "pool",
    }
    if name not in homes:
        raise AttributeError(f"module 'toolgym.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(f"toolgym.sandbox.{homes[name]}"), name)
