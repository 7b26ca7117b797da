"""Where a trainer's rollouts get their environments.

Every episode's environment comes from an `EpisodeFactory`, a function of the episode's row
and seed: the one factory shape the sampler, evaluation and the warm-up call. An `EnvMixture`
is one (it chooses by the row); a factory of no arguments (`toolgym.env_factory`'s, a pool's
lease) becomes one as `EveryRow`. `training_environments` turns the trainer's `env` (an id, a
class, a factory, tool functions, several of them by name) into one: `toolgym.env_factory`
for every placement, except `sandbox="ray"`, where a warm pool of Ray actors spread over the
cluster's nodes is leased from (and stopped by `close`, or when the trainer is collected).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import toolgym
from toolgym.algorithms.config import GRPOConfig

EpisodeFactory = Callable[[dict[str, Any], int | None], Any]
"""Makes (or leases) one episode's environment from its row and seed; it may write the row
(a mixture names the environment it chose in the row's `env` column)."""


@dataclass(frozen=True)
class EveryRow:
    """A factory of no arguments as an `EpisodeFactory`: the same environment for every row."""

    make: Callable[[], Any]

    def __call__(self, row: dict[str, Any], seed: int | None) -> Any:
        return self.make()


@dataclass
class ForEachRow:
    """A registered id whose environment is built from each episode's row
    (`toolgym.register(..., per_row=True)`) as an `EpisodeFactory`."""

    id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, row: dict[str, Any], seed: int | None) -> Any:
        return toolgym.spec(self.id).make_for(row, seed, **self.kwargs)


ENV_COLUMN = "env"
"""The dataset column that names a row's environment among several (TRL's convention)."""


class EnvMixture:
    """Several environments in one run, one per episode, each episode seeing only its own
    environment's tools. A row names its environment in the `env` column; a row without it
    gets one drawn by `weights` from its episode's seed (a GRPO group shares the seed, so a
    group plays one environment). Trainers log each environment's reward and success rate
    (`envs/<name>/...`), and per-environment reward functions return None for the others'
    episodes.

    Args:
        envs: Name -> what `toolgym.env_factory` takes (an id, a class, a factory, functions).
        kwargs: Name -> constructor arguments of that environment.
        sandbox: Where each environment is placed (as `toolgym.env_factory`).
        weights: Name -> relative weight for rows without an `env` column (default: equal).
    """

    def __init__(
        self,
        envs: Mapping[str, Any],
        kwargs: Mapping[str, dict[str, Any]] | None = None,
        sandbox: Any = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if not envs:
            raise ValueError("EnvMixture needs at least one environment")
        kwargs, weights = dict(kwargs or {}), dict(weights or dict.fromkeys(envs, 1.0))
        for name in {*kwargs, *weights} - set(envs):
            raise ValueError(f"{name!r} is not among the environments ({', '.join(envs)})")
        if any(w < 0 for w in weights.values()) or not any(weights.values()):
            raise ValueError("EnvMixture weights must be non-negative, not all zero")
        self.factories: dict[str, EpisodeFactory] = {
            str(name): _member(target, kwargs.get(name), sandbox) for name, target in envs.items()
        }
        self.weights = [float(weights.get(name, 0.0)) for name in self.factories]

    def name_for(self, row: Mapping[str, Any], seed: int | None) -> str:
        """The environment of a row: its `env` column, else a draw from the seed."""
        if ENV_COLUMN in row:
            name = str(row[ENV_COLUMN])
            if name not in self.factories:
                raise ValueError(
                    f"a row's {ENV_COLUMN!r} is {name!r}; the environments are "
                    f"{', '.join(self.factories)}"
                )
            return name
        return random.Random(seed).choices(list(self.factories), self.weights)[0]

    def __call__(self, row: dict[str, Any], seed: int | None) -> Any:
        """A new environment for this row's episode (the row's `env` is set to its name)."""
        name = self.name_for(row, seed)
        row[ENV_COLUMN] = name  # the trajectory's row says which one played
        return self.factories[name](row, seed)


def _member(target: Any, kwargs: dict[str, Any] | None, sandbox: Any) -> EpisodeFactory:
    """One environment of a mixture as an `EpisodeFactory` (an id built per row gets its
    row; the others are made alike for every row)."""
    if isinstance(target, str) and toolgym.spec(target).per_row:
        if sandbox not in (None, "local"):
            raise ValueError(f"{target} builds its environment per row, in this process only")
        return ForEachRow(target, dict(kwargs or {}))
    return EveryRow(toolgym.env_factory(target, kwargs, sandbox))


def episode_factory(
    env: Any, kwargs: dict[str, Any] | None = None, sandbox: Any = None
) -> EpisodeFactory:
    """What a trainer's `env` names, as an `EpisodeFactory`: several environments by name (a
    dict, or an `EnvMixture`) as a mixture, one (an id, a class, a factory of no arguments,
    tool functions) through `toolgym.env_factory`."""
    if isinstance(env, Mapping):
        return EnvMixture(env, kwargs, sandbox)
    if isinstance(env, (EnvMixture, EveryRow, ForEachRow)):
        return env
    if isinstance(env, str) and toolgym.spec(env).per_row:
        if sandbox not in (None, "local"):
            raise ValueError(f"{env} builds its environment per row, in this process only")
        return ForEachRow(env, dict(kwargs or {}))
    return EveryRow(toolgym.env_factory(env, kwargs, sandbox))


def training_environments(
    env: Any, kwargs: dict[str, Any], args: GRPOConfig, share: int, most: int
) -> tuple[EpisodeFactory, Any]:
    """(what makes or leases one rollout's environment, the warm pool behind it or None):
    `share` is this process's episodes per step, `most` the most it holds at once."""
    several = isinstance(env, (Mapping, EnvMixture))
    if several and args.sandbox == "ray":
        raise ValueError('sandbox="ray" takes one environment, not several (EnvMixture)')
    if args.sandbox != "ray":
        return episode_factory(env, kwargs, args.sandbox), None
    pool = _ray_pool(env, kwargs, args, share, most)
    return EveryRow(pool.lease), pool


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
