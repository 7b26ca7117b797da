"""`toolgym eval`: rows played `--rollouts` times each on any engine, their summary, pass@k
and mean@k with standard errors (`--report`), resumable from its output file, and the paired
comparison of two reports (`--compare`).

With `--fork-at-turn K`, a row's rollouts are a search from one state: the row is played once
for K turns, its environment forked and its context copied (`toolgym.algorithms.tree_rollouts`),
and each rollout goes on from there, so pass@k says how often some continuation from that
state succeeds. A row whose episode ended before turn K plays its rollouts from the start
(`eval_branched` 0 in its episodes' metrics)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from toolgym.agents.in_flight import (
    InFlightStore,
    resumable_rollout,
    resume_in_flight,
    task_fingerprint,
)
from toolgym.agents.trajectory import Trajectory, load_jsonl, save_jsonl, summarize
from toolgym.cli.env_spec import resolve_env
from toolgym.cli.episodes import (
    add_agent_arguments,
    build_agent,
    episode_rows,
    format_summary,
    make_envs,
)
from toolgym.cli.errors import CLIError
from toolgym.cli.eval_report import compare_reports, eval_report, format_comparison, format_report
from toolgym.cli.terminal import escape_log_output, terminal_text

Key = tuple[int, int]
"""(row, rollout) of one episode."""


def evaluate(args: argparse.Namespace) -> int:
    """`toolgym eval`."""
    if args.compare:
        return compare(args.compare, args.json)
    if args.env is None:
        raise CLIError("ENV is required (or --compare BASE.json NEW.json)")
    if args.rollouts < 1 or args.concurrency < 1:
        raise CLIError("--rollouts and --concurrency must be at least 1")
    if args.fork_at_turn is not None and (args.fork_at_turn < 1 or args.rollouts < 2):
        raise CLIError("--fork-at-turn K needs K >= 1 and --rollouts of at least 2 (the branches)")
    from tqdm.auto import tqdm

    escape_log_output()
    env_spec = resolve_env(args.env)
    rows = episode_rows(args, env_spec, args.n)
    if not rows:
        raise CLIError(f"{args.env}: no rows to play")
    done = _resumed(args.output, rows, args.rollouts) if args.resume else {}
    if args.output and not args.resume:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("")
    done, todo, per_chunk = _to_play(args, len(rows), done)
    store = _in_flight_store(args, done)
    if todo:
        _seed_sampling(args.seed)
        agent = build_agent(args)
        desc = terminal_text(f"eval {args.env}")
        with tqdm(total=len(todo), desc=desc, unit="episode") as bar:
            for start in range(0, len(todo), per_chunk):
                chunk = todo[start : start + per_chunk]
                done.update(_play(args, agent, env_spec, rows, chunk, bar.update, store))
        close = getattr(agent.engine, "close", None)
        if callable(close):
            close()
    grouped = [[done[(row, j)] for j in range(args.rollouts)] for row in range(len(rows))]
    episodes = [t for row in grouped for t in row]
    summary = summarize(episodes, args.success_threshold)
    report = eval_report(grouped, _settings(args, len(todo)), args.success_threshold)
    if args.json:
        print(json.dumps(report if args.rollouts > 1 or args.report else summary, indent=2))
    else:
        print(format_summary(args.env, summary))
        if args.rollouts > 1:
            print(terminal_text(format_report(report)))
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    if args.output and not args.json:
        where = terminal_text(args.output)
        print(f"trajectories: {where} (open them with: toolgym view {where})")
    return 0


def _to_play(
    args: argparse.Namespace, rows: int, done: dict[Key, Trajectory]
) -> tuple[dict[Key, Trajectory], list[Key], int]:
    """The episodes kept, those to play, and how many to play at once. With `--fork-at-turn`
    a tree is played whole (a row partly done is played again) and each chunk holds whole
    trees."""
    per_chunk = args.concurrency
    if args.fork_at_turn is not None:
        whole = range(args.rollouts)
        complete = {r for r in range(rows) if all((r, j) in done for j in whole)}
        done = {key: t for key, t in done.items() if key[0] in complete}
        per_chunk = max(1, args.concurrency // args.rollouts) * args.rollouts
    todo = [(r, j) for r in range(rows) for j in range(args.rollouts) if (r, j) not in done]
    return done, todo, per_chunk


def _play(
    args: argparse.Namespace,
    agent: Any,
    env_spec: Any,
    rows: list[dict[str, Any]],
    chunk: list[Key],
    tick: Any,
    store: InFlightStore | None = None,
) -> dict[Key, Trajectory]:
    """The episodes of `chunk`, played at once (each its own environment instance), each row
    reset with the seed `--seed` + its index (the same task in every rollout); appended to
    `--output` as soon as the chunk ends. With `store` (`--save-in-flight`), each episode is
    kept there after every turn, and one kept by an interrupted run goes on from it."""
    played, seeds = [rows[row] for row, _ in chunk], [args.seed + row for row, _ in chunk]
    envs = make_envs(args, env_spec, played, seeds)
    branched: list[Any] = []
    keys = [f"{row}-{rollout}" for row, rollout in chunk]
    try:
        if store is not None:
            trajectories = _play_kept(args, agent, store, envs, played, seeds, keys, tick)
        elif args.fork_at_turn is None:
            trajectories = agent.run(envs, played, seeds=seeds, on_episode_end=lambda _: tick())
        else:
            trajectories, branched = _search(args, agent, envs, played, seeds)
            tick(len(trajectories))
    finally:
        for env in [*envs, *(e for e in branched if e not in envs)]:
            env.close()
    for (row, rollout), trajectory in zip(chunk, trajectories, strict=True):
        trajectory.metrics["eval_row"], trajectory.metrics["eval_rollout"] = row, rollout
    if args.output:
        save_jsonl(trajectories, args.output, append=True)
    if store is not None:
        for key in keys:  # recorded: nothing to go on from
            store.discard(key)
    return dict(zip(chunk, trajectories, strict=True))


def _play_kept(
    args: argparse.Namespace,
    agent: Any,
    store: InFlightStore,
    envs: list[Any],
    rows: list[dict[str, Any]],
    seeds: list[int],
    keys: list[str],
    tick: Any,
) -> list[Trajectory]:
    """The episodes played with `--save-in-flight`: kept after every turn, and one an
    interrupted evaluation of the same task kept goes on from it."""
    tasks = {
        key: task_fingerprint(args.env, args.env_kwargs, args.sandbox, row, seed)
        for key, row, seed in zip(keys, rows, seeds, strict=True)
    }
    kept = resume_in_flight(store, keys, accept=lambda key, ep: ep.meta.get("task") == tasks[key])
    rollout = resumable_rollout(
        store,
        {id(env): key for env, key in zip(envs, keys, strict=True)},
        kept,
        meta=lambda key: {"task": tasks[key]},
    )
    return agent.run(envs, rows, seeds=seeds, on_episode_end=lambda _: tick(), rollout_fn=rollout)


def _in_flight_store(args: argparse.Namespace, done: dict[Key, Trajectory]) -> InFlightStore | None:
    """`--save-in-flight`'s folder beside `--output` (emptied unless resuming; the episodes
    `--output` already holds are forgotten there), or None without it."""
    if not args.save_in_flight:
        return None
    if args.output is None or args.fork_at_turn is not None:
        raise CLIError("--save-in-flight needs --output FILE.jsonl and no --fork-at-turn")
    store = InFlightStore(f"{args.output}.in-flight")
    if not args.resume:
        store.clear()
    for row, rollout in done:
        store.discard(f"{row}-{rollout}")
    return store


def _search(
    args: argparse.Namespace,
    agent: Any,
    envs: list[Any],
    rows: list[dict[str, Any]],
    seeds: list[int],
) -> tuple[list[Trajectory], list[Any]]:
    """Each row's rollouts as a tree branching after `--fork-at-turn` turns; the trajectories
    (`eval_branched`: 1 where the rollout went on from the fork) and the environments that
    played them."""
    from toolgym.algorithms.tree_rollouts import Branch, play_trees

    trajectories, played = play_trees(
        agent, envs, rows, seeds, group=args.rollouts, at_turn=args.fork_at_turn
    )
    for trajectory, env in zip(trajectories, played, strict=True):
        trajectory.metrics["eval_branched"] = float(isinstance(env, Branch))
    return trajectories, played


def _resumed(
    output: str | None, rows: list[dict[str, Any]], rollouts: int
) -> dict[Key, Trajectory]:
    """The episodes an interrupted evaluation already wrote to `output` (none if it does not
    exist). Raises CLIError for a file of another evaluation (an episode of a row beyond
    these, or whose row differs)."""
    if output is None:
        raise CLIError("--resume needs --output FILE.jsonl (the episodes played so far)")
    if not Path(output).exists():
        return {}
    done: dict[Key, Trajectory] = {}
    for trajectory in load_jsonl(output):
        row = int(trajectory.metrics.get("eval_row", -1))
        rollout = int(trajectory.metrics.get("eval_rollout", -1))
        expected = rows[row] if 0 <= row < len(rows) else None
        plain = {k: v for k, v in (expected or {}).items() if k != "prompt"}
        if expected is None or not 0 <= rollout < rollouts or trajectory.row != _jsonable(plain):
            raise CLIError(
                f"{output} holds an episode of another evaluation (row {row}, rollout "
                f"{rollout}): resume with the same ENV, dataset, -n, --seed and --rollouts, "
                "or write to a new --output"
            )
        done[(row, rollout)] = trajectory
    return done


def _jsonable(row: dict[str, Any]) -> Any:
    return json.loads(json.dumps(row, default=str))


def _seed_sampling(seed: int) -> None:
    """Pin the transformers engine's sampling (vLLM takes its own seed)."""
    import torch

    torch.manual_seed(seed)


def _settings(args: argparse.Namespace, played: int) -> dict[str, Any]:
    return {
        "env": args.env,
        "env_kwargs": args.env_kwargs,
        "dataset": args.dataset,
        "model": args.model,
        "engine": "server" if args.server else args.engine,
        "server": args.server,
        "temperature": args.temperature,
        "seed": args.seed,
        "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens,
        "max_episode_tokens": args.max_episode_tokens,
        "fork_at_turn": args.fork_at_turn,
        "episodes_played_now": played,
    }


def compare(paths: list[str], as_json: bool) -> int:
    """`toolgym eval --compare BASE.json NEW.json`."""
    reports = []
    for path in paths:
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as error:
            raise CLIError(f"cannot read the report {path}: {error}") from None
    try:
        comparison = compare_reports(*reports)
    except (ValueError, KeyError, TypeError) as error:
        raise CLIError(f"cannot compare {paths[0]} and {paths[1]}: {error}") from None
    text = json.dumps(comparison, indent=2) if as_json else format_comparison(comparison)
    print(terminal_text(text))
    return 0


def add_eval_command(commands: Any) -> None:
    """The `eval` subcommand."""
    parser = commands.add_parser(
        "eval", help="play N rows (each --rollouts times) and summarise; pass@k, reports"
    )
    add_agent_arguments(parser, optional_env=True)
    parser.add_argument("-n", type=int, default=8, help="rows (tasks)")
    parser.add_argument(
        "--rollouts", type=int, default=1, help="episodes per row (pass@k and mean@k over them)"
    )
    parser.add_argument(
        "--fork-at-turn",
        type=int,
        metavar="K",
        help="search: play each row K turns once, fork it, and play its --rollouts from there "
        "(pass@k over continuations of one state)",
    )
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight at once")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--success-threshold", type=float, default=1.0, help="reward that counts as a success"
    )
    parser.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="write the episodes' trajectories there as they end (for `toolgym view`, --resume)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the episodes --output already holds and play only the rest",
    )
    parser.add_argument(
        "--save-in-flight",
        action="store_true",
        help="after each turn, keep every unfinished episode's snapshot and context in "
        "FILE.jsonl.in-flight/, so that --resume goes on from an interrupted episode's last turn "
        "instead of playing it again (needs --output; environments that snapshot)",
    )
    parser.add_argument(
        "--report",
        metavar="FILE.json",
        help="write the report: settings, pass@k and mean@k with standard errors, per-row results",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE.json", "NEW.json"),
        help="compare two reports row by row (paired differences); plays nothing",
    )
    parser.set_defaults(handler=evaluate)
