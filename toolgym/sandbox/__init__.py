"""Where an environment instance lives: in this process, in a limited subprocess, or in a
Docker container, behind one surface (`RemoteEnvironment`).

    env = toolgym.make("PythonREPL-v0", sandbox="docker")   # or "process", "ray", "local", "auto"
    env.reset(seed=0)
    env.step(toolgym.ToolCall("run", {"code": "1 + 1"}))
    env.isolation      # what the sandbox actually got: network, filesystem, limits, user

This package's `__init__` stays light: the worker (`python -m toolgym.sandbox.worker`) imports
it inside minimal images. Names load on first use (`toolgym._exports`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.sandbox.backends import BACKENDS, backend, sandboxed, strongest_backend
    from toolgym.sandbox.docker import DockerBackend
    from toolgym.sandbox.pool import SandboxPool
    from toolgym.sandbox.process import ProcessBackend, ProcessLimits
    from toolgym.sandbox.ray_backend import RayBackend
    from toolgym.sandbox.remote import (
        Isolation,
        RemoteEnvironment,
        RemoteError,
        SandboxError,
        SandboxTimeout,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
