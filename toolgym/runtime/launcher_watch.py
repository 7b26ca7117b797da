"""A training process that outlives its launcher ends itself.

`accelerate launch` (torch elastic) starts each rank in a session of its own, so killing the
launcher's process group leaves the ranks running; a rank whose peer is gone then blocks in a
collective until its timeout (`GRPOConfig.distributed_timeout`). `watch_launcher` starts a
daemon thread that notices when the process's parent (the launcher's agent) is gone and ends
the process with a message naming its rank. A rank that fails while its launcher lives is
the launcher's to handle: torch elastic stops the other ranks and names the failed one.
"""

from __future__ import annotations

import os
import sys
import threading
import time

POLL_SECONDS = 0.5


def watch_launcher(rank: int, poll: float = POLL_SECONDS) -> threading.Thread:
    """Watch this process's parent; when it is gone, print why and exit (status 1)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        print(
            f"toolgym: rank {rank} exits: its launcher (pid {parent}) is gone, so the other "
            "ranks may be too (a collective would wait for them until distributed_timeout)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    thread = threading.Thread(target=watch, name="toolgym-launcher-watch", daemon=True)
    thread.start()
    return thread
