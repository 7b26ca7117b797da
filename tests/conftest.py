"""Fixtures for every test, and the suite's own empty caches."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

_CACHE_VARIABLES = (
    "TOOLGYM_CACHE",
    "XDG_CACHE_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)


def pytest_configure(config: pytest.Config) -> None:
    """Every run starts from empty caches, as on a fresh machine: toolgym's (the converted
    embedded model, warm-up results), and through `XDG_CACHE_HOME` vLLM's, Hugging Face's and
    the compilers'. Nothing the developer's machine holds in `~/.cache` reaches a test; a test
    that needs a warm cache builds it. `TOOLGYM_TEST_CACHE=folder` keeps one between runs
    (for local iteration only; CI never sets it)."""
    kept = os.environ.get("TOOLGYM_TEST_CACHE")
    root = kept or tempfile.mkdtemp(prefix="toolgym-test-cache-")
    config._toolgym_cache_root = None if kept else root  # type: ignore[attr-defined]
    for name in _CACHE_VARIABLES:
        os.environ[name] = os.path.join(root, name.lower())
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing downloads from a hub at run time


def pytest_unconfigure(config: pytest.Config) -> None:
    root = getattr(config, "_toolgym_cache_root", None)
    if root:
        shutil.rmtree(root, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failing test that holds real vLLM servers (a fixture that yields a `Servers`
    launcher, alone or in a tuple) gets the tails of their logs in its report: an engine's
    root cause is printed there, not in the HTTP error the test sees."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed:
        return
    seen: set[int] = set()
    for value in getattr(item, "funcargs", {}).values():
        for candidate in value if isinstance(value, tuple) else (value,):
            if callable(getattr(candidate, "log_tails", None)) and id(candidate) not in seen:
                seen.add(id(candidate))
                report.sections.append(("vLLM server logs", candidate.log_tails()))


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
    added = set(registry._registry) - set(before)
    twins = {registry._registry[env_id].gymnasium_id for env_id in added}
    for env_id in added:
        del registry._registry[env_id]
    registry._registry.update(before)
    if gymnasium is not None and gym_before is not None:
        # only the twins of ids this test registered: the first `import toolgym.gym` gives
        # every built-in id its twin once, and the module is not imported (run) again
        for gym_id in (set(gymnasium.registry) - gym_before) & twins:
            del gymnasium.registry[gym_id]
