"""The run viewer (`toolgym.viewer`): its paging and filter API in Python, then the page itself
in a real headless Chromium (tests/browser.py) on a tiny real training run and on a
10,000-episode trajectories file.

The browser tests skip when no Chromium is installed (`scripts/browser_setup.sh` installs
it), unless TOOLGYM_REQUIRE_BROWSER=1 (CI sets it): then they run and fail. Screenshots go to
the test's tmp_path, and also to TOOLGYM_SCREENSHOT_DIR when it is set.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import shutil
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch
from browser import Browser, find_chromium
from helpers import train_tool_caller

import toolgym
from toolgym.agents import AgentLimits
from toolgym.agents.trajectory import Sample, Trajectory, load_jsonl, save_jsonl
from toolgym.algorithms import GRPOConfig, GRPOTrainer
from toolgym.testing import tiny_tokenizer
from toolgym.viewer import data as data_module
from toolgym.viewer import start
from toolgym.viewer.data import RunData
from toolgym.viewer.server import RequestError, ViewerApp, ViewerServer
from toolgym.viewer.tokens import TokenDecoder

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_BROWSER") == "1"
needs_browser = pytest.mark.skipif(
    not REQUIRED and find_chromium() is None,
    reason="no chromium installed (scripts/browser_setup.sh installs the Debian package)",
)
READY = "document.body.dataset.ready === '1'"
STATUSES = ("env_done", "max_turns", "length", "finished", "tool_timeout")


# -- synthetic trajectories -----------------------------------------------------------------------
def synthetic_trajectory(rng: random.Random, number: int, vocab: int = 500) -> Trajectory:
    """A plausible tool-calling episode: user, assistant call, tool result, final answer, with
    ~100-300 completion tokens in sampled and observation blocks."""
    word = rng.choice(["crane", "slate", "moist", "pious", "adieu"])
    trajectory = Trajectory([Sample([rng.randrange(vocab) for _ in range(rng.randint(20, 60))])])
    for block in range(rng.randint(3, 7)):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(20, 50))]
        sampled = block % 2 == 0
        logprobs = [-rng.expovariate(2.0) for _ in ids] if sampled else None
        trajectory.append(ids, sampled=sampled, logprobs=logprobs)
    status = STATUSES[number % len(STATUSES)]
    trajectory.messages = [
        {"role": "user", "content": f"Episode {number}: find the secret word."},
        {
            "role": "assistant",
            "content": "",
            "raw_content": f'<tool_call>{{"name": "guess", "arguments": {{"word": "{word}"}}}}',
            "tool_calls": [{"function": {"name": "guess", "arguments": {"word": word}}}],
        },
        {"role": "tool", "name": "guess", "content": f"Guess 1/6: {word.upper()} (gray)"},
        {"role": "assistant", "content": f"The word is {word}.", "raw_content": word},
    ]
    trajectory.reward = round(rng.uniform(-1, 1), 3)
    trajectory.status = status  # type: ignore[assignment]
    trajectory.error = "tool timed out" if status == "tool_timeout" else None
    trajectory.metrics = {"turns": 2.0, "tool_calls": 1.0, "tool_failures": float(number % 3)}
    trajectory.metrics["step"] = number // 100 + 1
    trajectory.env_metrics = {"valid_guesses": float(number % 4), "win": float(number % 2)}
    trajectory.row = {"answer": word}
    return trajectory


def write_synthetic(path: Path, count: int, seed: int = 0) -> list[Trajectory]:
    """`count` synthetic trajectories saved with `save_jsonl` at `path`."""
    rng = random.Random(seed)
    trajectories = [synthetic_trajectory(rng, number) for number in range(count)]
    save_jsonl(trajectories, path)
    return trajectories


# -- the API, without a browser -------------------------------------------------------------------
def test_the_api_pages_filters_and_follows_a_growing_file(tmp_path):
    path = tmp_path / "episodes.jsonl"
    trajectories = write_synthetic(path, 120)
    with path.open("a") as file:
        file.write("{not json\n")
        file.write('{"json": "but not a trajectory"}\n')
    app = ViewerApp(RunData(path), TokenDecoder(path))
    page = app.answer("episodes", {"offset": "100", "limit": "50"})
    assert (page["total"], page["matched"], len(page["rows"])) == (120, 120, 20)
    assert [row["index"] for row in page["rows"]] == list(range(100, 120))
    assert app.answer("summary", {})["sources"][0]["malformed"] == 2

    timeouts = app.answer("episodes", {"status": "tool_timeout", "limit": "500"})
    assert timeouts["matched"] == sum(t.status == "tool_timeout" for t in trajectories)
    assert {row["status"] for row in timeouts["rows"]} == {"tool_timeout"}
    assert timeouts["statuses"]["env_done"] == 24  # the counts cover the unfiltered episodes
    found = app.answer("episodes", {"q": "EPISODE 7:", "limit": "500"})["rows"]
    assert [row["index"] for row in found] == [7]  # text search is case-insensitive
    ranged = app.answer("episodes", {"step_min": "2", "reward_min": "0", "limit": "500"})
    expected = [i for i, t in enumerate(trajectories) if t.metrics["step"] >= 2 and t.reward >= 0]
    assert [row["index"] for row in ranged["rows"]] == expected
    best = app.answer("episodes", {"sort": "-reward", "limit": "1"})["rows"][0]
    assert best["reward"] == max(t.reward for t in trajectories)

    episode = app.answer("episode", {"source": "episodes.jsonl", "index": "5"})
    tokens = episode["completion_tokens"]
    assert [t["id"] for t in tokens] == trajectories[5].completion_ids
    assert [t["mask"] for t in tokens] == trajectories[5].loss_mask
    assert all(t["text"] is None for t in tokens)  # no tokenizer next to the file
    assert episode["summary"]["env_metrics"] == trajectories[5].env_metrics
    with pytest.raises(RequestError, match="no episode 999"):
        app.answer("episode", {"source": "episodes.jsonl", "index": "999"})
    with pytest.raises(RequestError, match="sort must be"):
        app.answer("episodes", {"sort": "nonsense"})

    more = [synthetic_trajectory(random.Random(1), 500)]
    save_jsonl(more, path, append=True)
    with path.open("a") as file:
        file.write('{"prompt_ids": [1, 2')  # a line still being written is not counted yet
    assert app.answer("episodes", {"offset": "120"})["rows"][0]["reward"] == more[0].reward
    assert app.answer("summary", {})["sources"][0] == {
        "name": "episodes.jsonl",
        "episodes": 121,
        "malformed": 2,
    }
    rewritten = write_synthetic(path, 130, seed=3)  # in place ("w"), as evaluate() does
    assert app.answer("summary", {})["sources"][0]["episodes"] == 130
    assert app.answer("episodes", {"limit": "1"})["rows"][0]["reward"] == rewritten[0].reward


def test_files_before_and_after_samples_show_the_same_episodes(tmp_path):
    """A file written before `Trajectory.samples` (flat token fields, `turns`) and the same
    episodes saved in today's shape give the same rows, tokens and sample counts."""
    old = tmp_path / "old.jsonl"
    shutil.copy(Path(__file__).parents[1] / "data" / "trajectories_v1.jsonl", old)
    episodes = load_jsonl(old)
    episodes[1].reward_sources = {"env": None, "length_bonus": 0.5}
    save_jsonl(episodes, tmp_path / "new.jsonl")
    answers = {}
    for name in ("old.jsonl", "new.jsonl"):
        app = ViewerApp(RunData(tmp_path / name), TokenDecoder(tmp_path / name))
        rows = app.answer("episodes", {})["rows"]
        shown = [app.answer("episode", {"source": name, "index": str(i)}) for i in range(2)]
        answers[name] = (rows, shown)
        assert [row["samples"] for row in rows] == [1, 2]
        assert [row["reward"] for row in rows] == [1.0, None]
        for episode, trajectory in zip(shown, episodes, strict=True):
            assert [t["id"] for t in episode["prompt_tokens"]] == trajectory.prompt_ids
            completion = episode["completion_tokens"]
            assert [t["id"] for t in completion] == trajectory.completion_ids
            assert [t["mask"] for t in completion] == trajectory.loss_mask
            assert not {"samples", "turns", "completion_ids"} & set(episode["episode"])
        assert [e["samples"] for e in shown] == [1, 2]
    assert answers["new.jsonl"][1][1]["episode"]["reward_sources"]["length_bonus"] == 0.5


def test_metrics_are_reread_only_when_the_file_changes(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    app = ViewerApp(RunData(tmp_path), TokenDecoder(tmp_path))
    first = app.answer("metrics", {})
    assert first["rows"] == [{"step": 1, "reward": 0.5}]
    assert app.answer("metrics", {"version": first["version"]}) == {
        "version": first["version"],
        "unchanged": True,
    }
    with metrics.open("a") as file:
        file.write("garbage\n" + json.dumps({"step": 2, "reward": 0.7}) + "\n")
    second = app.answer("metrics", {"version": first["version"]})
    assert [row["step"] for row in second["rows"]] == [1, 2] and second["malformed"] == 1
    nested = {"step": 3, "reward": 0.9, "lists": [[1]], "statuses": {"env_done": 2, "x": {}}}
    with metrics.open("a") as file:
        file.write("[" * 100_000 + "]" * 100_000 + "\n" + json.dumps(nested) + "\n")
    third = app.answer("metrics", {})  # too deep: malformed; only what can be plotted is sent
    assert third["malformed"] == 2
    assert third["rows"][-1] == {"step": 3, "reward": 0.9, "statuses": {"env_done": 2}}


def get(url: str) -> tuple[int, bytes]:
    """The status and body of a GET (errors included)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_server_serves_the_page_and_strict_json(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": NaN, "kl": Infinity}\n')
    with start(tmp_path, port=0) as viewer:
        assert viewer.url.startswith("http://127.0.0.1:")
        status, page = get(viewer.url)
        assert status == 200 and b"/static/app.js" in page
        assert (
            get(viewer.url + "static/app.js")[0] == get(viewer.url + "static/style.css")[0] == 200
        )
        assert get(viewer.url + "static/../server.py")[0] == 404
        status, body = get(viewer.url + "api/metrics")
        assert status == 200 and json.loads(body)["rows"] == [
            {"step": 1, "reward": None, "kl": None}
        ]
        status, body = get(viewer.url + "api/episode?source=samples.jsonl&index=0")
        assert status == 404 and "no trajectories file" in json.loads(body)["error"]
        assert get(viewer.url + "api/episodes?offset=x")[0] == 400
    with pytest.raises(FileNotFoundError, match="no run folder"):
        start(tmp_path / "missing")


def bad_lines(good: dict) -> list[str]:
    """The lines of the wrong shape that once broke the viewer, each built on a good episode."""
    deep = '{"completion_ids": [], "messages": [], "row": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return [
        json.dumps({**good, "metrics": [1]}),
        json.dumps({**good, "env_metrics": "x"}),
        json.dumps({**good, "messages": [{"role": "assistant", "content": "", "tool_calls": 5}]}),
        deep,  # json.loads: RecursionError
        json.dumps({**good, "reward": 10**400}),  # math.isfinite: OverflowError
    ]


def append_lines(path: Path, lines: list[str]) -> None:
    """Append whole lines to `path`."""
    with path.open("a") as file:
        file.write("".join(line + "\n" for line in lines))


def test_bad_lines_are_counted_and_the_server_keeps_answering(tmp_path):
    path = tmp_path / "episodes.jsonl"
    write_synthetic(path, 4)
    good = json.loads(path.read_text().splitlines()[0])
    append_lines(path, bad_lines(good)[:3])
    save_jsonl([synthetic_trajectory(random.Random(1), 4)], path, append=True)
    with start(path) as viewer:  # indexing at start: no exception
        assert viewer.app.data.describe()["sources"][0]["malformed"] == 3
        append_lines(path, bad_lines(good)[3:])  # and while the viewer runs
        save_jsonl([synthetic_trajectory(random.Random(2), 5)], path, append=True)
        status, body = get(viewer.url + "api/episodes?limit=500")
        assert status == 200 and json.loads(body)["total"] == 6
        assert [row["index"] for row in json.loads(body)["rows"]] == list(range(6))
        status, body = get(viewer.url + "api/summary")
        assert status == 200
        assert json.loads(body)["sources"] == [
            {"name": "episodes.jsonl", "episodes": 6, "malformed": 5}
        ]
        assert get(viewer.url + "api/episode?source=episodes.jsonl&index=5")[0] == 200


def test_a_failing_reread_or_answer_is_a_json_error_not_a_dead_api(tmp_path, monkeypatch):
    path = tmp_path / "episodes.jsonl"
    write_synthetic(path, 3)
    with start(path) as viewer:

        def broken_refresh() -> None:
            raise PermissionError("the disk went away")

        monkeypatch.setattr(viewer.app.data, "refresh", broken_refresh)
        status, body = get(viewer.url + "api/episodes")
        assert status == 200 and json.loads(body)["total"] == 3  # what was indexed before
        summary = json.loads(get(viewer.url + "api/summary")[1])
        assert "the disk went away" in summary["refresh_error"]
        monkeypatch.undo()
        assert json.loads(get(viewer.url + "api/summary")[1])["refresh_error"] is None

        def broken_answer(params: dict) -> dict:
            raise ZeroDivisionError("a bug")

        monkeypatch.setattr(viewer.app, "episodes", broken_answer)
        status, body = get(viewer.url + "api/episodes")
        assert status == 500 and "ZeroDivisionError: a bug" in json.loads(body)["error"]
        assert get(viewer.url + "api/summary")[0] == 200  # the other routes still answer


def test_sorting_puts_episodes_without_a_value_last_both_ways(tmp_path):
    path = tmp_path / "episodes.jsonl"
    trajectories = write_synthetic(path, 6)
    for trajectory in trajectories[::2]:
        trajectory.reward = float("nan")  # saved as NaN: no value
        del trajectory.metrics["step"]
    save_jsonl(trajectories, path)
    app = ViewerApp(RunData(path), TokenDecoder(path))
    with_value = [i for i in range(6) if i % 2]
    for sort in ("reward", "-reward", "step", "-step"):
        rows = app.answer("episodes", {"sort": sort})["rows"]
        name = sort.lstrip("-")
        values = [row[name] for row in rows]
        assert values[3:] == [None] * 3 and [row["index"] for row in rows[3:]] == [0, 2, 4]
        assert values[:3] == sorted(values[:3], reverse=sort.startswith("-")), sort
        assert sorted(row["index"] for row in rows[:3]) == with_value


def test_search_reads_the_first_4000_characters_and_indexing_reports_progress(
    tmp_path, monkeypatch
):
    path = tmp_path / "episodes.jsonl"
    trajectories = write_synthetic(path, 3)
    trajectories[1].messages[0]["content"] = "early " + "x" * 5000 + " lateword"
    save_jsonl(trajectories, path)
    app = ViewerApp(RunData(path), TokenDecoder(path))
    assert [row["index"] for row in app.answer("episodes", {"q": "early"})["rows"]] == [1]
    assert app.answer("episodes", {"q": "lateword"})["matched"] == 0
    assert all(
        len(entry.text) <= data_module.SEARCH_CHARS for entry in app.data.files()[0].entries()
    )
    monkeypatch.setattr(data_module, "PROGRESS_SECONDS", 0.0)
    heard: list[int] = []
    RunData(path, progress=heard.append)
    assert heard == [1, 2, 3]


def test_compare_warns_when_the_paired_rows_differ(tmp_path):
    rng = random.Random(0)
    before = [synthetic_trajectory(rng, number) for number in range(2)]
    after = [synthetic_trajectory(rng, number) for number in range(2)]
    before[0].row, after[0].row = {"answer": "crane"}, {"answer": "crane"}
    before[1].row, after[1].row = {"answer": "crane"}, {"answer": "slate"}
    save_jsonl(before, tmp_path / "eval-before-greedy.jsonl")
    save_jsonl(after, tmp_path / "eval-after-greedy.jsonl")
    app = ViewerApp(RunData(tmp_path), TokenDecoder(tmp_path))
    assert "warning" not in app.answer("compare", {"mode": "greedy", "row": "0"})
    warning = app.answer("compare", {"mode": "greedy", "row": "1"})["warning"]
    assert "rows differ" in warning and "line number" in warning


def request(url: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET of `url` with the given Host header."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("GET", parts.path or "/", headers={"Host": host or parts.netloc})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_the_server_refuses_other_hosts_and_forbids_inline_code(tmp_path):
    write_synthetic(tmp_path / "samples.jsonl", 2)
    with start(tmp_path) as viewer:
        port = urllib.parse.urlsplit(viewer.url).port
        status, headers, body = request(viewer.url + "api/summary", host="evil.example")
        assert status == 403 and b"samples.jsonl" not in body  # DNS rebinding
        assert request(viewer.url, host=f"evil.example:{port}")[0] == 403
        assert request(viewer.url, host="localhost:1")[0] == 403
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert request(viewer.url + "api/summary", host=host)[0] == 200
        for path in ("", "static/app.js", "api/summary", "api/nothing", "missing"):
            for host in (None, "evil.example"):
                headers = request(viewer.url + path, host=host)[1]
                assert headers["Content-Security-Policy"].startswith("default-src 'self'")
                assert headers["X-Content-Type-Options"] == "nosniff"
        page = request(viewer.url)[2].decode()
    # the page works under that policy: no inline script, handler or style attribute
    assert re.findall(r"<script(?![^>]*\bsrc=)", page) == []
    assert re.findall(r"\son[a-z]+\s*=|\sstyle\s*=", page) == []


def test_tokens_come_back_at_once_while_the_tokenizer_loads(tmp_path):
    path = tmp_path / "episodes.jsonl"
    trajectories = write_synthetic(path, 1)
    tiny_tokenizer().save_pretrained(tmp_path / "engine-weights")
    gate = threading.Event()
    decoder = GatedDecoder(path, gate)
    app = ViewerApp(RunData(path), decoder)
    began = time.perf_counter()
    answer = app.answer("episode", {"source": "episodes.jsonl", "index": "0"})
    assert time.perf_counter() - began < 2 and answer["tokenizer"]["pending"]
    assert {(t["text"], t["token"]) for t in answer["completion_tokens"]} == {(None, None)}
    gate.set()
    assert decoder.ready(timeout=60)
    answer = app.answer("episode", {"source": "episodes.jsonl", "index": "0"})
    assert not answer["tokenizer"]["pending"] and answer["tokenizer"]["loaded"]
    tokenizer = decoder._tokenizer
    ids = trajectories[0].completion_ids
    assert [t["text"] for t in answer["completion_tokens"]] == [tokenizer.decode([i]) for i in ids]
    assert [t["token"] for t in answer["completion_tokens"]] == tokenizer.convert_ids_to_tokens(ids)


class GatedDecoder(TokenDecoder):
    """A TokenDecoder whose tokenizer loads only once `gate` is set (a slow load, on demand)."""

    def __init__(self, run_path: Path, gate: threading.Event) -> None:
        self.gate = gate
        super().__init__(run_path)

    def _load(self) -> None:
        self.gate.wait(60)
        super()._load()


# -- a tiny real run, in the browser ---------------------------------------------------------------
def train_tiny_run(folder: Path) -> None:
    """Two GRPO steps of a tiny tool-calling model on Wordle, with greedy evaluations before
    and after, written to `folder`; its tokenizer saved in `folder/engine-weights`."""
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    rows = list(toolgym.spec("Wordle-v0").dataset(4, seed=0))
    args = GRPOConfig(
        output_dir=str(folder),
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=3, max_new_tokens=40, max_episode_tokens=300),
        parser="hermes",
        learning_rate=1e-3,
        temperature=1.2,
        progress_bar=False,
    )
    trainer = GRPOTrainer(
        train_tool_caller(tokenizer),  # a tiny random model taught to call tools
        "Wordle-v0",
        rows,
        args=args,
        tokenizer=tokenizer,
        eval_dataset=list(toolgym.spec("Wordle-v0").dataset(3, seed=5)),
    )
    trainer.evaluate(samples_file="eval-before-greedy.jsonl")
    trainer.train()
    trainer.evaluate(samples_file="eval-after-greedy.jsonl")
    tokenizer.save_pretrained(folder / "engine-weights")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A run folder from a tiny real GRPO run on Wordle: metrics.jsonl, samples.jsonl, the
    greedy evaluations before and after, and the tokenizer in engine-weights/."""
    folder = tmp_path_factory.mktemp("run")
    # torch's thread count is left alone: changing it and back changes later tests' training
    # bits (OpenMP's reductions split differently), and some tests depend on a trained model
    train_tiny_run(folder)
    return folder


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's browser tests."""
    if find_chromium() is None and not REQUIRED:
        pytest.skip("no chromium installed (scripts/browser_setup.sh installs it)")
    with Browser() as instance:
        yield instance


def save_screenshot(browser: Browser, tmp_path: Path, name: str) -> Path:
    """A full-page PNG in tmp_path (and TOOLGYM_SCREENSHOT_DIR); checks it is a real image."""
    path = browser.screenshot(tmp_path / name)
    if os.environ.get("TOOLGYM_SCREENSHOT_DIR"):
        folder = Path(os.environ["TOOLGYM_SCREENSHOT_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / name)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 600 and len(data) > 20_000, (width, height, len(data))
    return path


def open_view(browser: Browser, hash_: str, rendered: str) -> None:
    """Follow a hash link in the page and wait until that view has rendered."""
    browser.evaluate(f"location.hash = {json.dumps(hash_)}")
    browser.wait_for(f"document.body.dataset.rendered === {json.dumps(rendered)}")


def js(browser: Browser, expression: str):
    """Evaluate in the page; shorthand."""
    return browser.evaluate(expression)


@needs_browser
def test_the_page_shows_a_real_run(run_folder, browser, tmp_path):
    steps = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    files = ["samples.jsonl", "eval-before-greedy.jsonl", "eval-after-greedy.jsonl"]
    episodes = {name: load_jsonl(run_folder / name) for name in files}
    with start(run_folder) as viewer:
        browser.goto(viewer.url, ready=READY)
        assert not browser.errors and not js(browser, "document.body.dataset.error || ''")
        check_curves(browser, steps)
        check_table(browser, episodes)
        save_screenshot(browser, tmp_path, "viewer-run.png")
        check_episode(browser, episodes["samples.jsonl"], run_folder)
        save_screenshot(browser, tmp_path, "viewer-episode.png")
        check_compare(browser, episodes)
        save_screenshot(browser, tmp_path, "viewer-compare.png")
        check_live_updates(browser, run_folder, steps, episodes)
    assert not browser.errors


def check_curves(browser: Browser, steps: list[dict]) -> None:
    """The reward curve plots each logged step at its logged value; each env/* metric has its
    chart in its own group; the statuses chart has one line per status."""
    points = "[...document.querySelectorAll('figure[data-key=\"reward\"] circle.pt')]"
    plotted = js(browser, f"{points}.map(c => [Number(c.dataset.step), Number(c.dataset.value)])")
    assert plotted == [[row["step"], row["reward"]] for row in steps] and len(steps) == 2
    groups = js(browser, "[...document.querySelectorAll('.curve-group')].map(g => g.dataset.group)")
    assert groups[0] == "Reward & success"
    env_keys = sorted(
        {
            key
            for row in steps
            for key, value in row.items()
            if key.startswith("env/") and isinstance(value, (int, float)) and math.isfinite(value)
        }
    )
    assert env_keys, "a Wordle run logs env/* metrics"
    env_charts = js(
        browser,
        '[...document.querySelectorAll(\'.curve-group[data-group="Environment skills"]'
        " figure')].map(f => f.dataset.key)",
    )
    assert sorted(env_charts) == env_keys
    names = sorted({name for row in steps for name in row.get("statuses") or {}})
    assert names, "each step logs its episodes' statuses"
    lines = js(
        browser,
        "[...document.querySelectorAll('figure[data-key=\"statuses\"] polyline')]"
        ".map(p => p.dataset.series)",
    )
    assert sorted(lines) == names


def set_filter(browser: Browser, selector: str, value: str, event: str = "change") -> None:
    """Set a filter control as a user would, firing its event."""
    browser.evaluate(
        f"(() => {{ const c = document.querySelector({json.dumps(selector)});"
        f" c.value = {json.dumps(value)}; c.dispatchEvent(new Event({json.dumps(event)})); }})()"
    )


def wait_for_table(browser: Browser, fragment: str) -> list[dict]:
    """Wait until the table shows a page loaded with `fragment` in its query; its rows."""
    query = "(document.querySelector('#episode-table').dataset.query || '')"
    browser.wait_for(f"{query}.includes({json.dumps(fragment)})")
    return js(
        browser,
        "[...document.querySelectorAll('#episode-table tbody tr[data-source]')]"
        ".map(r => ({...r.dataset}))",
    )


def check_table(browser: Browser, episodes: dict[str, list[Trajectory]]) -> None:
    """The table lists every episode with the total; the status and step filters narrow it."""
    total = sum(len(e) for e in episodes.values())
    assert js(browser, "Number(document.querySelector('#episode-total').dataset.total)") == total
    assert len(wait_for_table(browser, "offset=0")) == total
    every = [t for name in episodes for t in episodes[name]]
    counts = {
        status: sum(t.status == status for t in every) for status in {t.status for t in every}
    }
    assert len(counts) > 1, counts  # the fixture's episodes end in more than one way
    status = min(counts, key=counts.get)
    set_filter(browser, "#f-status", status)
    shown = wait_for_table(browser, f"status={status}")
    assert [row["status"] for row in shown] == [status] * counts[status] and len(shown) < total
    set_filter(browser, "#f-status", "")
    set_filter(browser, "#f-step-min", "2", "input")
    shown = wait_for_table(browser, "step_min=2")
    expected = [i for i, t in enumerate(episodes["samples.jsonl"]) if t.metrics["step"] >= 2]
    assert [int(row["index"]) for row in shown] == expected and 0 < len(expected) < total
    set_filter(browser, "#f-step-min", "", "input")
    query = "document.querySelector('#episode-table').dataset.query"
    browser.wait_for(f"!{query}.includes('step_min=2')")
    assert js(browser, "document.querySelectorAll('#episode-table tbody tr').length") == total
    env = js(browser, "document.querySelector('#episode-table tbody td.env').textContent")
    assert "valid_guesses" in env  # Wordle's episode metrics


def check_episode(browser: Browser, samples: list[Trajectory], run_folder: Path) -> None:
    """One span per completion token, coloured by mask, decoded like the tokenizer; the
    conversation shows the tool calls."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_folder / "engine-weights")
    index = max(  # the episode with the most valid tool calls
        range(len(samples)),
        key=lambda i: samples[i].metrics["tool_calls"] - samples[i].metrics["tool_failures"],
    )
    assert {0, 1} <= set(samples[index].loss_mask) and samples[index].metrics["tool_calls"]
    trajectory = samples[index]
    open_view(browser, f"#episode=samples.jsonl:{index}", f"episode=samples.jsonl:{index}")
    browser.wait_for("document.querySelector('#tokens').dataset.pending === '0'")
    spans = js(
        browser,
        "[...document.querySelectorAll('#tokens .tok')].map(s => ({id: Number(s.dataset.id),"
        " mask: Number(s.dataset.mask), logprob: s.dataset.logprob, text: s.textContent,"
        " title: s.title, background: getComputedStyle(s).backgroundColor}))",
    )
    assert [s["id"] for s in spans] == trajectory.completion_ids
    assert [s["mask"] for s in spans] == trajectory.loss_mask
    assert [s["text"] for s in spans] == [tokenizer.decode([i]) for i in trajectory.completion_ids]
    raw = tokenizer.convert_ids_to_tokens(trajectory.completion_ids)
    for span, logprob, mask, token in zip(
        spans, trajectory.logprobs, trajectory.loss_mask, raw, strict=True
    ):
        assert f"(raw {json.dumps(token, ensure_ascii=False)})" in span["title"]
        if mask:
            assert float(span["logprob"]) == pytest.approx(logprob)
            assert f"id {span['id']}" in span["title"] and "logprob" in span["title"]
    sampled = {s["background"] for s in spans if s["mask"] == 1}
    observed = {s["background"] for s in spans if s["mask"] == 0}
    assert sampled and observed and not sampled & observed
    check_shading([s for s in spans if s["mask"] == 1])  # a confident model: close logprobs
    prompt = js(browser, "document.querySelectorAll('#prompt-tokens .tok.prompt').length")
    assert prompt == len(trajectory.prompt_ids)
    calls = js(
        browser,
        "[...document.querySelectorAll('#conversation .tool-call')].map(c => c.textContent)",
    )
    expected = [call["function"] for m in trajectory.messages for call in m.get("tool_calls") or []]
    assert len(calls) == len(expected) > 0
    for shown, call in zip(calls, expected, strict=True):
        arguments = call["arguments"]
        name, _, text = shown.partition("(")
        assert name == call["name"] and text.endswith(")")
        shown_arguments = text[:-1] if isinstance(arguments, str) else json.loads(text[:-1])
        assert shown_arguments == arguments


def brightness(colour: str) -> int:
    """The sum of the channels of a computed `rgb(r, g, b)` colour."""
    return sum(int(part) for part in re.findall(r"\d+", colour)[:3])


def check_shading(sampled: list[dict], spread: float = 0.0) -> None:
    """Among sampled tokens, a lower logprob never gets a lighter shade, and the lowest is
    darker than the highest (where their logprobs lie more than `spread` apart: asserted)."""
    ordered = sorted(sampled, key=lambda s: float(s["logprob"]))
    shades = [brightness(s["background"]) for s in ordered]
    assert shades == sorted(shades), [(s["logprob"], s["background"]) for s in ordered]
    low, high = ordered[0], ordered[-1]
    assert float(high["logprob"]) - float(low["logprob"]) > spread
    if spread:
        assert brightness(low["background"]) < brightness(high["background"]), (low, high)


def check_compare(browser: Browser, episodes: dict[str, list[Trajectory]]) -> None:
    """Before and after of the same dataset row, side by side."""
    row = 1
    before, after = (
        episodes["eval-before-greedy.jsonl"][row],
        episodes["eval-after-greedy.jsonl"][row],
    )
    assert before.row == after.row
    open_view(browser, f"#compare=greedy:{row}", f"compare=greedy:{row}")
    sides = js(
        browser,
        "[...document.querySelectorAll('.compare-side')].map(s => [s.dataset.source,"
        " s.dataset.row, s.querySelectorAll('.msg').length])",
    )
    assert sides == [
        ["eval-before-greedy.jsonl", str(row), len(before.messages)],
        ["eval-after-greedy.jsonl", str(row), len(after.messages)],
    ]
    assert before.row["answer"] in js(browser, "document.querySelector('#compare-row').textContent")
    assert js(browser, "document.querySelector('#compare-warning').hidden")  # the rows match


def check_live_updates(
    browser: Browser, run_folder: Path, steps: list[dict], episodes: dict[str, list[Trajectory]]
) -> None:
    """A step and an episode written while the page is open show up without a reload."""
    open_view(browser, "#", "overview")
    with (run_folder / "metrics.jsonl").open("a") as file:
        file.write(json.dumps({**steps[-1], "step": 3, "reward": 0.5}) + "\n")
    save_jsonl(episodes["samples.jsonl"][:1], run_folder / "samples.jsonl", append=True)
    points = "document.querySelectorAll('figure[data-key=\"reward\"] circle.pt').length"
    browser.wait_for(f"{points} === 3", timeout=15)
    total = sum(len(e) for e in episodes.values()) + 1
    browser.wait_for(f"document.querySelector('#episode-total').dataset.total === '{total}'")


# -- 10,000 episodes -------------------------------------------------------------------------------
@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@needs_browser
def test_ten_thousand_episodes_stay_responsive(browser, tmp_path):
    path = tmp_path / "many.jsonl"
    write_synthetic(path, 10_000)
    began = time.perf_counter()
    with start(path) as viewer:
        indexed = time.perf_counter() - began  # what `toolgym view` spends before serving
        browser.goto(viewer.url, ready=READY)
        load_ms = js(browser, "window.toolgymLoadMs")  # from the page's navigation on
        print(
            f"\n10,000 episodes ({path.stat().st_size / 1e6:.0f} MB): the server indexed them in"
            f" {indexed:.2f} s, then the page was ready in {load_ms:.0f} ms"
            f" ({indexed + load_ms / 1000:.2f} s from start to a usable page)"
        )
        assert js(browser, "document.querySelector('#episode-total').dataset.total") == "10000"
        assert "10,000 episodes" in js(
            browser, "document.querySelector('#episode-total').textContent"
        )
        assert js(browser, "document.querySelectorAll('#episode-table tbody tr').length") == 50
        js(browser, "document.querySelector('#page-next').click()")
        browser.wait_for(
            "(document.querySelector('#episode-table').dataset.query || '').includes('offset=50')"
        )
        first = js(browser, "document.querySelector('#episode-table tbody tr').dataset.index")
        assert first == "50"
        assert "No tokenizer" in js(browser, "document.querySelector('#notices').textContent")
        save_screenshot(browser, tmp_path, "viewer-10000.png")
        open_view(browser, "#episode=many.jsonl:9999", "episode=many.jsonl:9999")
        assert js(browser, "document.querySelector('#tokens .tok').textContent").startswith("[")
    assert indexed < 60 and load_ms < 5000 and not browser.errors


def test_step_rewards_are_marked_on_the_sample_they_belong_to(browser, tmp_path):
    """A chat episode trained one sample per turn shows its last sample's tokens: only that
    sample's step rewards are marked, after the token that ends each step."""
    first, last = Sample([1, 2, 3]), Sample([1, 2, 3, 4, 5])
    first.append([10, 11, 12, 13], sampled=True, logprobs=[-0.5] * 4)
    last.append([20, 21, 22], sampled=True, logprobs=[-0.5] * 3)
    last.append([30, 31], sampled=False)
    last.append([40, 41, 42], sampled=True, logprobs=[-0.5] * 3)
    steps = [
        {"sample": 0, "start": 0, "end": 4, "reward": 0.25, "in_reward": 1},
        {"sample": 1, "start": 0, "end": 3, "reward": -0.5, "in_reward": 1},
        {"sample": 1, "start": 5, "end": 8, "reward": 0.75, "in_reward": 1},
    ]
    path = tmp_path / "samples.jsonl"
    save_jsonl([Trajectory([first, last], reward=1.0, step_rewards=steps)], path)
    with start(path) as viewer:
        browser.goto(viewer.url, ready=READY)
        open_view(browser, "#episode=samples.jsonl:0", "episode=samples.jsonl:0")
        marks = js(
            browser,
            "[...document.querySelectorAll('#tokens > *')].flatMap((e, i, all) =>"
            " e.classList.contains('step-reward') ? [[all.slice(0, i).filter(t =>"
            " t.classList.contains('tok')).length, e.textContent]] : [])",
        )
    # after the 3rd and the 8th completion token of the last sample; not sample 0's at 4
    assert [position for position, _ in marks] == [3, 8], marks
    assert not browser.errors


RED_PNG = (  # 4 x 4 pixels
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAFElEQVR4nGM8ISfHAAN"
    "MDEgANwcANHYBDK9qubUAAAAASUVORK5CYII="
)
SVG = "data:image/svg+xml;base64,PHN2Zz48c2NyaXB0PndpbmRvdy5fX3hzcz0xPC9zY3JpcHQ+PC9zdmc+"


@needs_browser
def test_a_tool_results_images_are_shown_raster_only(browser, tmp_path):
    """A tool message's images (`content_blocks`) show under the page's policy; an SVG one,
    which could carry a script, is not shown at all."""
    blocks = [
        {"type": "text", "text": "the board:"},
        {"type": "image", "image": RED_PNG},
        {"type": "image", "image": SVG},
    ]
    trajectory = Trajectory([Sample([1, 2, 3], [4, 5], [1, 1], [-0.5, -0.5])])
    trajectory.messages = [
        {"role": "user", "content": "look"},
        {"role": "tool", "name": "look", "content": "the board:", "content_blocks": blocks},
    ]
    path = tmp_path / "samples.jsonl"
    save_jsonl([trajectory], path)
    with start(path) as viewer:
        browser.goto(viewer.url, ready=READY)
        open_view(browser, "#episode=samples.jsonl:0", "episode=samples.jsonl:0")
        browser.wait_for("[...document.querySelectorAll('img.tool-image')].every(i => i.complete)")
        shown = js(
            browser,
            "[...document.querySelectorAll('img.tool-image')].map(i => [i.src, i.naturalWidth])",
        )
    assert shown == [[RED_PNG, 4]]  # loaded (the policy allows data: images), and no SVG
    assert not js(browser, "window.__xss || 0") and not browser.errors


@needs_browser
def test_a_judges_chat_and_answer_are_shown_as_text(browser, tmp_path):
    """Each judge call kept with an episode (`Trajectory.judgements`) is shown folded: who
    judged, the score or the failure, then the chat and the answer, never as HTML."""
    xss = '<img src=x onerror="window.__xss=1">'
    trajectory = Trajectory([Sample([1, 2, 3], [4, 5], [1, 1], [-0.5, -0.5])])
    trajectory.messages = [{"role": "user", "content": "define it"}]
    trajectory.judgements = [
        {
            "judge": "meaning",
            "model": "self",
            "mode": "pointwise",
            "messages": [{"role": "user", "content": f"grade this {xss}"}],
            "answer": f"meaning: 8 {xss}",
            "score": 0.8,
            "scores": {"meaning": 8.0},
            "seconds": 0.5,
            "cached": False,
        },
        {"judge": "meaning", "model": "self", "messages": [], "answer": "", "error": xss},
    ]
    path = tmp_path / "samples.jsonl"
    save_jsonl([trajectory], path)
    with start(path) as viewer:
        browser.goto(viewer.url, ready=READY)
        open_view(browser, "#episode=samples.jsonl:0", "episode=samples.jsonl:0")
        shown = js(
            browser,
            "[...document.querySelectorAll('[data-fact=judgement]')].map(e => e.textContent)",
        )
    assert len(shown) == 2
    assert "meaning · self: score 0.8 (meaning 8)" in shown[0] and f"grade this {xss}" in shown[0]
    assert f"meaning: 8 {xss}" in shown[0] and xss in shown[1]
    assert not js(browser, "window.__xss || 0") and not browser.errors


# -- hostile text, huge curves, a slow tokenizer ---------------------------------------------------
HOSTILE = '<img src=x onerror="window.__xss=1"> <script>window.__xss=1</script>'
LOGGED_STEPS = 150_000  # past what Math.min(...values) can spread


def hostile_run(folder: Path) -> list[Trajectory]:
    """A run folder whose first episode carries HTML in every text field, with a failed and a
    fine tool call; a malformed line; evaluations whose second rows differ; 150,000 logged
    steps; the tokenizer in engine-weights/."""
    rng = random.Random(0)
    trajectories = [synthetic_trajectory(rng, number) for number in range(3)]
    call = {"function": {"name": HOSTILE, "arguments": {"word": HOSTILE}}}
    trajectories[0].messages = [
        {"role": "user", "content": HOSTILE},
        {"role": "assistant", "content": "", "reasoning_content": HOSTILE, "tool_calls": [call]},
        {"role": "tool", "name": "guess", "content": f"Error: {HOSTILE}"},
        {"role": "tool", "name": "guess", "content": "Errors so far: none"},
        # newer files name each call's failure: that, not the wording, decides
        {"role": "tool", "name": "guess", "content": "Error: echoed back", "failure": None},
        {"role": "tool", "name": "guess", "content": "quietly wrong", "failure": "tool_error"},
        {"role": "assistant", "content": HOSTILE, "raw_content": HOSTILE},
    ]
    trajectories[0].error = HOSTILE
    trajectories[0].env_metrics = {HOSTILE: 1.0}
    trajectories[0].row = {"answer": HOSTILE}
    trajectories[1].row, trajectories[2].row = {"answer": "crane"}, {"answer": "slate"}
    save_jsonl(trajectories, folder / "samples.jsonl")
    append_lines(folder / "samples.jsonl", ["{not json"])
    save_jsonl(trajectories[:2], folder / "eval-before-greedy.jsonl")
    save_jsonl([trajectories[0], trajectories[2]], folder / "eval-after-greedy.jsonl")
    rows = (
        {
            "step": step,
            "reward": round(math.sin(step / 1000), 4),
            "statuses": {"env_done": step % 3},
        }
        for step in range(1, LOGGED_STEPS + 1)
    )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    tiny_tokenizer().save_pretrained(folder / "engine-weights")
    return trajectories


@needs_browser
def test_the_page_shows_files_before_and_after_samples(browser, tmp_path):
    """A per-turn episode from a file written before `Trajectory.samples` and from one
    written after: its last turn's tokens, the note that it trained per turn, and (new
    files) the reward's sources."""
    old, new = tmp_path / "old" / "episodes.jsonl", tmp_path / "new" / "episodes.jsonl"
    old.parent.mkdir()
    new.parent.mkdir()
    shutil.copy(Path(__file__).parents[1] / "data" / "trajectories_v1.jsonl", old)
    episodes = load_jsonl(old)
    episodes[1].reward_sources = {"env": None, "length_bonus": 0.5}
    save_jsonl(episodes, new)
    for path in (old, new):
        with start(path) as viewer:
            browser.goto(viewer.url, ready=READY)
            open_view(browser, "#episode=episodes.jsonl:1", "episode=episodes.jsonl:1")
            browser.wait_for("document.querySelector('#tokens').dataset.pending === '0'")
            ids = js(
                browser,
                "[...document.querySelectorAll('#tokens .tok')].map(s => Number(s.dataset.id))",
            )
            assert ids == episodes[1].completion_ids
            note = js(browser, "document.querySelector('#token-note').textContent")
            assert "trains on 2 samples" in note and "sample 1's tokens" in note
            fact = "document.querySelector('[data-fact=\"reward sources\"]')"
            sources = js(browser, f"{fact} ? {fact}.textContent : ''")
            assert ("length_bonus 0.5" in sources) is (path == new), sources
            # the sample graph (files with `samples`): one button per sample; the first shows
            # the first turn's tokens
            nodes = js(browser, "document.querySelectorAll('#sample-graph .sample-node').length")
            assert nodes == (2 if path == new else 0)
            if path == old:
                continue
            js(browser, "document.querySelector('#sample-graph .sample-node').click()")
            browser.wait_for(
                "document.querySelector('#token-note').textContent.includes('sample 0')"
            )
            ids = js(
                browser,
                "[...document.querySelectorAll('#tokens .tok')].map(s => Number(s.dataset.id))",
            )
            assert ids == episodes[1].samples[0].completion_ids
        assert not browser.errors


@needs_browser
def test_the_page_shows_html_as_text_huge_curves_and_a_slow_tokenizer(browser, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    trajectories = hostile_run(folder)
    gate = threading.Event()
    with ViewerServer(ViewerApp(RunData(folder), GatedDecoder(folder, gate))) as viewer:
        browser.goto(viewer.url, ready=READY)
        assert not js(browser, "document.body.dataset.error || ''")
        check_huge_curves(browser)
        notices = js(browser, "document.querySelector('#notices').textContent")
        assert "samples.jsonl: 1 malformed line" in notices
        assert js(browser, "document.querySelectorAll('#view-overview img').length") == 0
        save_screenshot(browser, tmp_path, "viewer-huge-curves.png")
        open_view(browser, "#episode=samples.jsonl:0", "episode=samples.jsonl:0")
        check_html_as_text(browser)
        check_pending_tokens(browser, gate, trajectories[0])
        save_screenshot(browser, tmp_path, "viewer-hostile-episode.png")
        open_view(browser, "#compare=greedy:1", "compare=greedy:1")
        warning = "document.querySelector('#compare-warning')"
        assert not js(browser, f"{warning}.hidden")
        assert "rows differ" in js(browser, f"{warning}.textContent")
        save_screenshot(browser, tmp_path, "viewer-compare-warning.png")
        open_view(browser, "#compare=greedy:0", "compare=greedy:0")
        assert js(browser, f"{warning}.hidden")
        open_view(browser, "#episode=%E0%A4%A", "overview")  # a malformed %-escape: the run
        assert not js(browser, "document.body.dataset.error || ''")
        time.sleep(0.3)  # an injected <img> would have fired onerror by now
        assert js(browser, "typeof window.__xss") == "undefined"
    assert not browser.errors


def check_huge_curves(browser: Browser) -> None:
    """150,000 steps: the curves are drawn, thinned to 1,500 points with no dot per point, and
    hovering shows the logged value of the nearest step."""
    figure = "document.querySelector('figure[data-key=\"reward\"]')"
    shape = js(
        browser,
        f"(() => {{ const f = {figure}; return [f.dataset.points, f.dataset.thinned,"
        " f.querySelector('polyline').dataset.drawn, f.querySelectorAll('circle').length]; })()",
    )
    assert shape == [str(LOGGED_STEPS), "1", "1500", 1]  # the one circle: the hover marker
    assert js(browser, "document.querySelectorAll('figure[data-error]').length") == 0
    assert js(browser, "document.querySelectorAll('figure[data-key=\"statuses\"]').length") == 1
    label = js(
        browser,
        f"(() => {{ const f = {figure}, g = f.querySelector('svg'),"
        " b = g.getBoundingClientRect();"
        " g.dispatchEvent(new MouseEvent('mousemove', {clientX: b.left + 0.6 * b.width,"
        " clientY: b.top + b.height / 2}));"
        " return f.querySelector('text.hover-label').textContent; })()",
    )
    step, value = re.fullmatch(r"@ step (\d+): (\S+)", label).groups()
    assert 0 < int(step) <= LOGGED_STEPS
    assert float(value) == pytest.approx(math.sin(int(step) / 1000), abs=0.01)


def check_html_as_text(browser: Browser) -> None:
    """Markup in messages, tool calls, the error and the row is shown as text, never parsed;
    a tool result is marked as a failure by its `failure` (older files: by "Error:")."""
    shown = js(browser, "document.querySelector('#view-episode').textContent")
    assert shown.count(HOSTILE) >= 6
    parsed = "document.querySelectorAll('#view-episode img, #view-episode script').length"
    assert js(browser, parsed) == 0
    failed = js(
        browser,
        "[...document.querySelectorAll('#conversation .msg[data-role=\"tool\"]')]"
        ".map(m => m.classList.contains('tool-error'))",
    )
    assert failed == [True, False, False, True]


def check_pending_tokens(browser: Browser, gate: threading.Event, trajectory: Trajectory) -> None:
    """While the tokenizer loads, the tokens show their ids and the page asks again; once it
    has loaded, they are decoded without a reload."""
    tokens = "document.querySelector('#tokens')"
    assert js(browser, f"{tokens}.dataset.pending") == "1"
    assert js(browser, f"{tokens}.querySelector('.tok').textContent").startswith("[")
    assert "Loading the tokenizer" in js(
        browser, "document.querySelector('#token-note').textContent"
    )
    gate.set()
    browser.wait_for(f"{tokens}.dataset.pending === '0'", timeout=60)
    tokenizer = tiny_tokenizer()
    spans = js(
        browser,
        f"[...{tokens}.querySelectorAll('.tok')].map(s => ({{text: s.textContent,"
        " mask: Number(s.dataset.mask), logprob: s.dataset.logprob,"
        " background: getComputedStyle(s).backgroundColor}))",
    )
    assert [s["text"] for s in spans] == [tokenizer.decode([i]) for i in trajectory.completion_ids]
    check_shading([s for s in spans if s["mask"] == 1], spread=1.0)


def test_the_episode_api_shows_the_sample_graph_and_any_sample(tmp_path):
    """An episode of several samples (a compacted one: the third's prompt is shorter than the
    second's sequence) lists each sample's parent, role and token counts, and shows any one."""
    trajectory = Trajectory([Sample([1, 2], [3, 4, 5], [1, 1, 0], [-0.1, -0.2, 0.0])])
    trajectory.samples.append(Sample([1, 2, 3, 4, 5, 6], [7], [1], [-0.3], parent=0))
    trajectory.samples.append(Sample([1, 8], [9, 10], [1, 0], [-0.4, 0.0], parent=1, role="judge"))
    path = tmp_path / "episodes.jsonl"
    save_jsonl([trajectory], path)
    with start(path) as viewer:
        status, body = get(viewer.url + "api/episode?source=episodes.jsonl&index=0")
        assert status == 200
        answer = json.loads(body)
        assert answer["samples"] == 3 and answer["sample"] == 2
        assert answer["graph"] == [
            {"index": 0, "parent": None, "role": "policy", "prompt": 2, "sampled": 2,
             "observation": 1},
            {"index": 1, "parent": 0, "role": "policy", "prompt": 6, "sampled": 1,
             "observation": 0},
            {"index": 2, "parent": 1, "role": "judge", "prompt": 2, "sampled": 1,
             "observation": 1},
        ]  # fmt: skip
        assert [t["id"] for t in answer["completion_tokens"]] == [9, 10]
        status, body = get(viewer.url + "api/episode?source=episodes.jsonl&index=0&sample=0")
        assert status == 200 and json.loads(body)["sample"] == 0
        assert [t["id"] for t in json.loads(body)["completion_tokens"]] == [3, 4, 5]
        status, body = get(viewer.url + "api/episode?source=episodes.jsonl&index=0&sample=3")
        assert status == 404 and "there is no sample 3" in json.loads(body)["error"]
        assert get(viewer.url + "api/episode?source=episodes.jsonl&index=0&sample=x")[0] == 400
