"""Seeds and the `random` module: a class that draws from the module's shared generator
(`random.choice(...)`) instead of its own cannot be reached by the seed `reset` receives.

At a class's first reset, `warn_if_unseedable` looks through its methods' bytecode for draws
from the `random` module and warns (`UnseededRandomWarning`) if it finds any: two instances
reset with the same seed (a GRPO group) may then start from different states. A class that
cannot change its draws opts in with `seed_global_random = True`: toolgym then seeds the
`random` module with the episode's seed right before each reset (`global_random_seeded`),
under a lock shared by all such classes, so the reset's own draws are reproducible. Draws in
tools are not (episodes run concurrently and share the module's generator).

Standard library only: a sandbox worker runs `global_random_seeded` around its resets.
"""

from __future__ import annotations

import contextlib
import dis
import inspect
import random
import threading
import types
import warnings
from collections.abc import Iterator
from typing import Any


class UnseededRandomWarning(UserWarning):
    """An environment draws from the `random` module, which the episode's seed cannot reach."""


DRAWS = frozenset(random.__all__) - {"Random", "SystemRandom", "seed", "getstate", "setstate"}
"""The `random` module's functions that draw from its shared generator."""

_LOCK = threading.Lock()
_warned: set[type] = set()


def seeds_global_random(cls: type) -> bool:
    """Whether the class asked toolgym to seed the `random` module before each reset."""
    return bool(getattr(cls, "seed_global_random", False))


@contextlib.contextmanager
def global_random_seeded(cls: type, seed: int | None) -> Iterator[None]:
    """Around a reset: for a class with `seed_global_random = True` and a seed, the `random`
    module seeded with it, and no other such reset in between (a lock); else nothing."""
    if seed is None or not seeds_global_random(cls):
        yield
        return
    with _LOCK:
        random.seed(seed)
        yield


def warn_if_unseedable(cls: type) -> None:
    """Warn once per class, at its first reset, if it draws from the `random` module and did
    not opt in to `seed_global_random`."""
    if cls in _warned:
        return
    _warned.add(cls)
    if seeds_global_random(cls):
        return
    where = global_random_draws(cls)
    if where:
        warnings.warn(
            f"{cls.__name__} draws from the `random` module ({', '.join(where)}), which the "
            "seed passed to reset cannot reach: two instances reset with the same seed (a "
            "GRPO group) may start from different states. Draw from a generator of its own "
            "(`random.Random(seed)`; a reset that names a `seed` parameter receives it, and a "
            "toolgym.Environment's "
            "`self.rng` is seeded), or set `seed_global_random = True` on the class to have "
            "toolgym seed the `random` module with the episode's seed before each reset "
            "(such resets take turns; draws in tools stay unreproducible).",
            UnseededRandomWarning,
            stacklevel=3,
        )


def global_random_draws(cls: type) -> list[str]:
    """`Class.method: random.choice`-style notes of the class's draws from the `random`
    module (its own methods and properties, its bases' but toolgym's and `object`'s)."""
    found = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "toolgym.envs.core":
            continue
        for name, value in vars(klass).items():
            for function in _functions(value):
                found += [f"{klass.__name__}.{name}: {draw}" for draw in _draws(function)]
    return sorted(set(found))


def _functions(value: Any) -> list[types.FunctionType]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset) if inspect.isfunction(f)]
    value = inspect.unwrap(value) if callable(value) else value  # a decorated method
    return [value] if inspect.isfunction(value) else []


def _draws(function: types.FunctionType) -> list[str]:
    """The module-level draws in a function's code (nested functions and lambdas included)."""
    namespace = function.__globals__
    draws, codes = [], [function.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        previous = None
        for instruction in dis.get_instructions(code):
            name = instruction.argval
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(name, str):
                value = namespace.get(name)
                drawn = getattr(value, "__name__", None) in DRAWS
                if drawn and getattr(value, "__self__", None) is getattr(random, "_inst", None):
                    draws.append(f"{name} (from random)")  # `from random import choice`
                previous = value
                continue
            if (
                instruction.opname in ("LOAD_ATTR", "LOAD_METHOD")
                and previous is random
                and name in DRAWS
            ):
                draws.append(f"random.{name}")
            previous = None
    return draws
