"""What the run viewer reads: a run folder's `metrics.jsonl` and its trajectory files.

A trajectories file (`samples.jsonl`, `eval-<stage>-<mode>.jsonl`, any `save_jsonl` output) is
indexed once, line by line: the byte offset of each episode and a small summary (step, reward,
status, turns, tool failures, environment metrics, and the lowercased text of its messages for
search, at most its first `SEARCH_CHARS` characters). Pages of summaries are filtered and sorted
in memory; a full episode is read from its offset on demand. Files that grow while a run writes
them are indexed incrementally. A line that cannot be indexed, whatever the reason (not JSON,
not a trajectory, fields of the wrong shape, nested too deeply, numbers out of range), is skipped
and counted as malformed. Only the standard library is used here.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = re.compile(r"^eval-(?P<stage>.+)-(?P<mode>[^-]+)\.jsonl$")
SORT_KEYS = ("index", "step", "reward", "turns", "tool_failures", "tokens")
"""The columns `/api/episodes` sorts by (prefix with `-` for descending)."""
SEARCH_CHARS = 4000
"""How much of each episode's text (messages, then error) the text search looks at."""
ERROR_CHARS = 1000
"""How much of an episode's error its table row keeps."""
PROGRESS_SECONDS = 2.0
"""How often a long indexing reports its progress (see `RunData(progress=...)`)."""

Progress = Callable[[int], None]
"""Called with the number of episodes indexed so far, while a long indexing runs."""


def _finite(value: Any) -> float | None:
    """`value` as a float, or None where it is not a finite number (OverflowError for an
    integer too large for a float: its line counts as malformed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _message_text(message: dict[str, Any]) -> str:
    """The searchable text of one message: its content and its tool calls (TypeError or
    AttributeError where they have the wrong shape)."""
    parts = [str(message.get("content") or ""), str(message.get("reasoning_content") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return "\n".join(part for part in parts if part)


def search_text(data: dict[str, Any], limit: int = SEARCH_CHARS) -> str:
    """The lowercased text the search looks at: the messages, then the error, at most `limit`
    characters (the rest of a long episode is not read)."""
    parts, size = [], 0
    for message in [*data["messages"], {"content": data.get("error")}]:
        if size >= limit:
            break
        if isinstance(message, dict):
            text = _message_text(message)[: limit - size]
            parts.append(text)
            size += len(text) + 1
    return "\n".join(parts)[:limit].lower()


def shown_sample(data: dict[str, Any], index: int | None = None) -> tuple[dict[str, Any], int]:
    """The sample the token view shows, and how many samples the episode trains on: sample
    `index` of `samples` (default the last: the episode as the model last saw it), or, in
    files written before `samples`, the flat `prompt_ids` ... `logprobs` (a per-turn
    episode's last turn, with its earlier turns in `turns`)."""
    samples = data.get("samples")
    if isinstance(samples, list):
        at = len(samples) - 1 if index is None else index
        if not 0 <= at < len(samples) and samples:
            raise IndexError(f"the episode has {len(samples)} samples; there is no sample {at}")
        chosen = samples[at] if samples and isinstance(samples[at], dict) else {}
        return chosen, len(samples)
    return data, max(1, len(data.get("turns") or []))


def sample_graph(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's samples as a graph: for each, its `parent` (the sample it continues,
    None for a root), its `role`, and its prompt, sampled and observation token counts."""
    samples = data.get("samples")
    if not isinstance(samples, list):
        return []
    graph = []
    for index, sample in enumerate(samples):
        sample = sample if isinstance(sample, dict) else {}
        mask = _list(sample.get("loss_mask"))
        sampled = sum(1 for value in mask if value == 1)
        parent = sample.get("parent", index - 1 if index else None)  # older files: a chain
        graph.append(
            {
                "index": index,
                "parent": parent if isinstance(parent, int) else None,
                "role": str(sample.get("role") or "policy"),
                "prompt": len(_list(sample.get("prompt_ids"))),
                "sampled": sampled,
                "observation": len(_list(sample.get("completion_ids"))) - sampled,
            }
        )
    return graph


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def summarize_episode(data: dict[str, Any], source: str, index: int) -> dict[str, Any]:
    """The table row of one trajectory dict (`Trajectory.to_dict()`)."""
    metrics = data.get("metrics") or {}
    env_metrics = data.get("env_metrics") or {}
    error = data.get("error")
    sample, samples = shown_sample(data)
    return {
        "source": source,
        "index": index,
        "step": _finite(metrics.get("step")),
        "reward": _finite(data.get("reward")),
        "status": str(data.get("status") or "unknown"),
        "turns": _finite(metrics.get("turns")),
        "tool_calls": _finite(metrics.get("tool_calls")),
        "tool_failures": _finite(metrics.get("tool_failures")),
        "tokens": len(sample.get("completion_ids") or []),
        "samples": samples,
        "error": None if error is None else str(error)[:ERROR_CHARS],
        "env_metrics": {k: v for k, v in env_metrics.items() if _finite(v) is not None},
    }


def is_trajectory(data: Any) -> bool:
    """Whether a parsed JSON line looks like `Trajectory.to_dict()` output (`samples`, or
    the flat `completion_ids` of files written before them)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("samples", data.get("completion_ids")), list)
        and isinstance(data.get("messages"), list)
    )


@dataclass(slots=True)
class _Entry:
    """One indexed episode: where its line lies in the file, its summary and search text."""

    offset: int
    length: int
    summary: dict[str, Any]
    text: str


@dataclass
class EpisodeFile:
    """A trajectories JSONL file, indexed by line (see the module docstring).

    Attributes:
        path: The file.
        name: How the viewer names it (the file name, relative to the run folder).
        malformed: Lines skipped because they could not be indexed (not JSON, not a
            trajectory, or fields of the wrong shape).
    """

    path: Path
    name: str
    malformed: int = 0
    _entries: list[_Entry] = field(default_factory=list)
    _indexed_bytes: int = 0
    _identity: tuple[int, int] = (0, 0)
    _fingerprint: bytes = b""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self, progress: Progress | None = None) -> None:
        """Index what was appended since the last call (everything again if the file was
        replaced, shrank, or was rewritten in place); `progress` hears how far a long
        indexing got, every `PROGRESS_SECONDS`."""
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._reset((0, 0))
                return
            identity = (stat.st_ino, stat.st_dev)
            if (
                identity != self._identity
                or stat.st_size < self._indexed_bytes
                or self._read_fingerprint() != self._fingerprint
            ):
                self._reset(identity)
            if stat.st_size > self._indexed_bytes:
                self._index_from(self._indexed_bytes, progress)
                self._fingerprint = self._read_fingerprint()

    def _read_fingerprint(self) -> bytes:
        """The file's first bytes and the bytes just before the indexed end: when either
        changed, the file was rewritten rather than appended to."""
        end = self._indexed_bytes
        with self.path.open("rb") as file:
            head = file.read(min(end, 1024))
            file.seek(max(0, end - 256))
            return head + file.read(min(end, 256))

    def _reset(self, identity: tuple[int, int]) -> None:
        """Forget the index (the file is indexed again from its start)."""
        self._entries, self._indexed_bytes, self.malformed = [], 0, 0
        self._identity, self._fingerprint = identity, b""

    def _index_from(self, start: int, progress: Progress | None = None) -> None:
        """Index the complete lines from byte `start` on; the indexed end moves with each line,
        so a read error part way leaves a consistent index to go on from."""
        next_report = time.monotonic() + PROGRESS_SECONDS
        with self.path.open("rb") as file:
            file.seek(start)
            for line in file:
                if not line.endswith(b"\n"):
                    break  # a line still being written: index it next time
                self._add_line(line, self._indexed_bytes)
                self._indexed_bytes += len(line)
                if progress is not None and time.monotonic() >= next_report:
                    progress(len(self._entries))
                    next_report = time.monotonic() + PROGRESS_SECONDS

    def _add_line(self, line: bytes, offset: int) -> None:
        """Index one line, or count it as malformed if anything about it is wrong."""
        if not line.strip():
            return
        try:
            data = json.loads(line)
            if not is_trajectory(data):
                raise ValueError("not a trajectory")
            summary = summarize_episode(data, self.name, len(self._entries))
            entry = _Entry(offset, len(line), summary, search_text(data))
        except Exception:  # any line of any shape: skipped and counted, never fatal
            self.malformed += 1
            return
        self._entries.append(entry)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[_Entry]:
        """The indexed episodes, in file order (a snapshot of the current index)."""
        with self._lock:
            return list(self._entries)

    def read(self, index: int) -> dict[str, Any]:
        """The full trajectory dict of episode `index` (IndexError if there is none)."""
        with self._lock:
            if not 0 <= index < len(self._entries):
                raise IndexError(f"{self.name} has no episode {index} (it has {len(self)})")
            entry = self._entries[index]
        with self.path.open("rb") as file:
            file.seek(entry.offset)
            return json.loads(file.read(entry.length))

    def summary(self, index: int) -> dict[str, Any]:
        """The table row of episode `index`."""
        with self._lock:
            return self._entries[index].summary


@dataclass
class EpisodeQuery:
    """Filters, sort and page of `/api/episodes`; every filter is optional."""

    source: str | None = None
    status: str | None = None
    text: str | None = None
    step_min: float | None = None
    step_max: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    sort: str = "index"
    offset: int = 0
    limit: int = 50

    @classmethod
    def from_params(cls, params: dict[str, str]) -> EpisodeQuery:
        """The query from URL parameters (`q` is the text search); ValueError if malformed."""

        def number(name: str) -> float | None:
            value = params.get(name, "").strip()
            return float(value) if value else None

        sort = params.get("sort") or "index"
        if sort.lstrip("-") not in SORT_KEYS:
            raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)} (optionally with -)")
        return cls(
            source=params.get("source") or None,
            status=params.get("status") or None,
            text=(params.get("q") or "").strip().lower() or None,
            step_min=number("step_min"),
            step_max=number("step_max"),
            reward_min=number("reward_min"),
            reward_max=number("reward_max"),
            sort=sort,
            offset=max(0, int(params.get("offset") or 0)),
            limit=min(500, max(1, int(params.get("limit") or 50))),
        )

    def keeps(self, entry: _Entry) -> bool:
        """Whether an episode passes the status, range and text filters."""
        row = entry.summary
        if self.status and row["status"] != self.status:
            return False
        if not _within(row["step"], self.step_min, self.step_max):
            return False
        if not _within(row["reward"], self.reward_min, self.reward_max):
            return False
        return not self.text or self.text in entry.text


def _within(value: float | None, low: float | None, high: float | None) -> bool:
    """Whether `value` lies in [low, high] (a missing bound: no limit that side)."""
    if low is None and high is None:
        return True
    if value is None:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def sort_entries(entries: list[_Entry], sort: str) -> list[_Entry]:
    """`entries` sorted by the summary column `sort` (`-name`: descending); episodes without
    a value come last either way, and ties keep file order."""
    name = sort.lstrip("-")
    present = [entry for entry in entries if entry.summary[name] is not None]
    missing = [entry for entry in entries if entry.summary[name] is None]
    present.sort(key=lambda entry: entry.summary[name], reverse=sort.startswith("-"))
    return present + missing


class MetricsFile:
    """`metrics.jsonl`, re-read only when its size or modification time changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._version = ""
        self._rows: list[dict[str, Any]] = []
        self.malformed = 0
        self._lock = threading.Lock()

    def read(self) -> tuple[str, list[dict[str, Any]]]:
        """`(version, rows)`: a version string that changes with the file, and its steps."""
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._version, self._rows, self.malformed = "missing", [], 0
                return self._version, self._rows
            version = f"{stat.st_size}-{stat.st_mtime_ns}"
            if version != self._version:
                self._rows, self.malformed = _read_metrics(self.path)
                self._version = version
            return self._version, self._rows


def _read_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a metrics file and how many lines were malformed."""
    rows, malformed = [], 0
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    for position, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            # the last line may still be being written: not malformed (yet)
            malformed += position < len(lines) - 1
            continue
        if isinstance(row, dict):
            rows.append(_plottable(row))
        else:
            malformed += 1
    return rows, malformed


def _plottable(row: dict[str, Any]) -> dict[str, Any]:
    """What the page can plot of one metrics row: its scalars and its dicts of scalars (lists
    and deeper values are left out, so that no row is too deep to send)."""

    def scalar(value: Any) -> bool:
        return value is None or isinstance(value, (str, int, float))

    return {
        key: value if scalar(value) else {k: v for k, v in value.items() if scalar(v)}
        for key, value in row.items()
        if scalar(value) or isinstance(value, dict)
    }


def _source_order(name: str) -> tuple[int, str, str]:
    """samples.jsonl first, then evaluation files by mode with `before` ahead of `after`."""
    match = EVAL_FILE.match(name)
    if name == "samples.jsonl":
        return (0, "", "")
    if match:
        stage = {"before": "0", "after": "~"}.get(match["stage"], match["stage"])
        return (1, match["mode"], stage)
    return (2, name, "")


class RunData:
    """Everything the viewer shows for one PATH: a run folder or a single trajectories file.

    Args:
        path: A folder written by `GRPOTrainer` (metrics.jsonl, samples.jsonl, eval-*.jsonl),
            or one trajectories JSONL file.
        progress: Called with the number of episodes indexed so far every `PROGRESS_SECONDS`
            while an indexing takes that long (`toolgym view` prints it).

    Raises:
        FileNotFoundError: `path` does not exist.
    """

    def __init__(self, path: str | Path, progress: Progress | None = None) -> None:
        self.path = Path(path).expanduser().resolve()
        if not self.path.exists():
            raise FileNotFoundError(f"no run folder or trajectories file at {path}")
        self.is_run = self.path.is_dir()
        self.metrics = MetricsFile(self.path / METRICS_FILE) if self.is_run else None
        self._files: dict[str, EpisodeFile] = {}
        self._lock = threading.Lock()
        self.progress = progress
        self.refresh()

    def refresh(self) -> None:
        """Pick up trajectory files that appeared, and index what was appended to each."""
        for name in self._discover():
            with self._lock:
                if name not in self._files:
                    self._files[name] = EpisodeFile(self._file_path(name), name)
        done = 0
        for episode_file in self.files():
            episode_file.refresh(self._progress_after(done))
            done += len(episode_file)

    def _progress_after(self, done: int) -> Progress | None:
        """`self.progress` for a file indexed after `done` episodes of the earlier files."""
        report = self.progress
        return None if report is None else lambda count: report(done + count)

    def _discover(self) -> list[str]:
        if not self.is_run:
            return [self.path.name]
        names = [p.name for p in self.path.glob("*.jsonl") if p.name != METRICS_FILE]
        return sorted(names, key=_source_order)

    def _file_path(self, name: str) -> Path:
        return self.path / name if self.is_run else self.path

    def files(self) -> list[EpisodeFile]:
        """The trajectory files, samples first, then the evaluations."""
        with self._lock:
            return sorted(self._files.values(), key=lambda f: _source_order(f.name))

    def file(self, name: str) -> EpisodeFile:
        """The trajectory file called `name` (KeyError if the run has none)."""
        with self._lock:
            if name not in self._files:
                raise KeyError(f"no trajectories file {name!r} in {self.path}")
            return self._files[name]

    def compare_modes(self) -> dict[str, list[str]]:
        """Evaluation mode -> its files' names, first stage (`before`) to last (`after`)."""
        modes: dict[str, list[str]] = {}
        for episode_file in self.files():
            match = EVAL_FILE.match(episode_file.name)
            if match:
                modes.setdefault(match["mode"], []).append(episode_file.name)
        return modes

    def episodes(self, query: EpisodeQuery) -> dict[str, Any]:
        """One page of episode summaries that pass `query`, and the counts around it."""
        files = [f for f in self.files() if query.source in (None, f.name)]
        entries = [entry for f in files for entry in f.entries()]
        statuses: dict[str, int] = {}
        for entry in entries:
            statuses[entry.summary["status"]] = statuses.get(entry.summary["status"], 0) + 1
        kept = [entry for entry in entries if query.keeps(entry)]
        if query.sort != "index":
            kept = sort_entries(kept, query.sort)
        page = kept[query.offset : query.offset + query.limit]
        return {
            "total": len(entries),
            "matched": len(kept),
            "offset": query.offset,
            "limit": query.limit,
            "statuses": dict(sorted(statuses.items())),
            "rows": [entry.summary for entry in page],
        }

    def describe(self) -> dict[str, Any]:
        """The run at a glance: its kind, its files with their counts, and evaluation modes."""
        return {
            "path": str(self.path),
            "kind": "run" if self.is_run else "file",
            "sources": [
                {"name": f.name, "episodes": len(f), "malformed": f.malformed} for f in self.files()
            ],
            "compare": self.compare_modes(),
            "metrics": self.metrics is not None and self.metrics.path.exists(),
        }
