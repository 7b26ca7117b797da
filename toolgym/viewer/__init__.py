"""The run viewer: `toolgym view PATH` opens a page on a training run or a trajectories file.

The page plots `metrics.jsonl` (polling while the run writes it), pages through episodes with
filters and text search, shows one episode as a conversation and as tokens coloured by their
loss mask and shaded by their logprob, and puts before/after evaluation episodes of one dataset
row side by side. Everything is served from this package on 127.0.0.1 (no network).

```python
from toolgym.viewer import serve, start

serve("runs/wordle")  # blocks; prints the URL
with start("runs/wordle", port=0) as viewer:  # in a thread (tests)
    print(viewer.url)
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym._exports import lazy_exports

if TYPE_CHECKING:  # the public names: type checkers read them, and lazy_exports too
    from toolgym.viewer.launch import serve, start
    from toolgym.viewer.server import ViewerServer

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
