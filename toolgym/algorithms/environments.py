"""Where a trainer's rollouts get their environments.

`training_environments` turns the trainer's `env` (an id, a class, a factory, tool functions)
into what makes one rollout's environment: `toolgym.env_factory` for every placement, except
`sandbox="ray"`, where a warm pool of Ray actors spread over the cluster's nodes is leased
from (and stopped by `close`, or when the trainer is collected).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import toolgym
from toolgym.algorithms.config import GRPOConfig


def training_environments(
    env: Any, kwargs: dict[str, Any], args: GRPOConfig, share: int, most: int
) -> tuple[Callable[[], Any], Any]:
    """(what makes or leases one rollout's environment, the warm pool behind it or None):
    `share` is this process's episodes per step, `most` the most it holds at once."""
    if args.sandbox != "ray":
        return toolgym.env_factory(env, kwargs, args.sandbox), None
    pool = _ray_pool(env, kwargs, args, share, most)
    return pool.lease, pool


def _ray_pool(
    env: str | type | Callable[[], Any],
    kwargs: dict[str, Any],
    args: GRPOConfig,
    share: int,
    most: int,
) -> Any:
    """A warm pool of `env` in Ray actors spread over the cluster's nodes (`RAY_ADDRESS`, else
    a Ray of this process): `share` instances (a step's) kept warm, up to `most` alive."""
    from toolgym.registry import _resolve
    from toolgym.sandbox.pool import SandboxPool
    from toolgym.sandbox.ray_backend import RayBackend

    target, options = env, dict(kwargs)
    if isinstance(env, str):
        spec = toolgym.spec(env)  # fail early on an unknown id
        target = _resolve(spec.entry_point, what=f"entry point of {env}")
        options = {**spec.kwargs, **kwargs}
    if not isinstance(target, type):
        raise ValueError(
            'sandbox="ray" needs an environment class or an id registered with one (a Ray '
            f"actor imports it by module and name), not {target!r}"
        )
    backend = RayBackend(resources=dict(args.sandbox_resources or {}), spread=True)
    return SandboxPool(
        target,
        options,
        backend=backend,
        size=share,
        max_instances=most,
        start_threads=min(32, max(1, most)),
    )
