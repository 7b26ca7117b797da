"""Which backend places an environment instance: by name (`backend`), the strongest this
machine offers (`strongest_backend`), and an instance placed by it (`sandboxed`). The
backends load on first use, so importing this module costs nothing."""

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
