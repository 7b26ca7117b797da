"""Fixtures for every test."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _registrations_stay_in_their_test() -> Iterator[None]:
    """Ids a test registers (and their gymnasium twins) are removed after it, and ids it
    overrode are restored, so no test sees another's (a leaked `test/McpWordle-v0` once
    changed another test's "Did you mean" suggestion)."""
    from toolgym import registry

    before = dict(registry._registry)
    gymnasium = sys.modules.get("gymnasium")
    gym_before = set(gymnasium.registry) if gymnasium is not None else None
    yield
    for env_id in set(registry._registry) - set(before):
        del registry._registry[env_id]
    registry._registry.update(before)
    if gymnasium is not None and gym_before is not None:
        for gym_id in set(gymnasium.registry) - gym_before:
            if gym_id.startswith("toolgym/"):
                del gymnasium.registry[gym_id]
