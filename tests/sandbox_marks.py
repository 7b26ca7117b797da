"""Skip marks for tests that need a sandbox backend (bubblewrap, Docker); with
TOOLGYM_REQUIRE_SANDBOXES=1 (CI) they run, and fail where the backend is missing."""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"


def _docker_ready() -> bool:
    from toolgym.sandbox.docker import docker_ready

    return docker_ready()


needs_bwrap = pytest.mark.skipif(
    not REQUIRED and shutil.which("bwrap") is None,
    reason="bubblewrap is not installed (apt-get install bubblewrap; scripts/sandbox_setup.sh)",
)
needs_docker = pytest.mark.skipif(
    not REQUIRED and not _docker_ready(),
    reason="no Docker daemon or no sandbox image (scripts/sandbox_setup.sh as root)",
)
