"""Starting the viewer: in a background thread (`start`) or until interrupted (`serve`)."""

from __future__ import annotations

import webbrowser
from pathlib import Path

from toolgym.viewer.data import Progress, RunData
from toolgym.viewer.server import ViewerApp, ViewerServer
from toolgym.viewer.tokens import TokenDecoder


def start(
    path: str | Path,
    port: int = 0,
    tokenizer: str | None = None,
    host: str = "127.0.0.1",
    progress: Progress | None = None,
) -> ViewerServer:
    """Index `path` and serve the viewer in a background thread; returns at once.

    Args:
        path: A run folder (metrics.jsonl, samples.jsonl, eval-*.jsonl) or a trajectories
            JSONL file.
        port: The port to listen on; 0 picks a free one (see `.url`).
        tokenizer: A tokenizer folder for the token view; by default the run's own
            (`engine-weights/` or the newest `checkpoint-*/`).
        host: The address to bind.
        progress: Called with the number of episodes indexed so far, every 2 s while the
            first indexing (or a later long one) runs.

    Raises:
        FileNotFoundError: `path` does not exist.
        OSError: The port cannot be bound.
    """
    data = RunData(path, progress=progress)
    decoder = TokenDecoder(data.path, tokenizer)
    return ViewerServer(ViewerApp(data, decoder), host=host, port=port)


def serve(
    path: str | Path, port: int = 8765, tokenizer: str | None = None, open_browser: bool = False
) -> None:
    """Serve the viewer on `path` until interrupted (Ctrl-C), printing its URL.

    Args:
        path: A run folder or a trajectories JSONL file (see `start`).
        port: The port on 127.0.0.1; 0 picks a free one.
        tokenizer: A tokenizer folder for the token view (default: the run's own).
        open_browser: Open the page in the default web browser.
    """
    viewer = start(path, port=port, tokenizer=tokenizer, progress=_print_progress)
    counts = ", ".join(
        f"{s['name']}: {s['episodes']}"
        + (f" ({s['malformed']} malformed lines skipped)" if s["malformed"] else "")
        for s in viewer.app.data.describe()["sources"]
    )
    print(f"toolgym viewer on {viewer.url} ({counts or 'no episodes yet'}); Ctrl-C stops it")
    if open_browser:
        webbrowser.open(viewer.url)
    try:
        viewer.wait()
    except KeyboardInterrupt:
        pass
    finally:
        viewer.close()


def _print_progress(count: int) -> None:
    """Say how far a long indexing got (`serve` on a big file)."""
    print(f"indexed {count:,} episodes...", flush=True)
