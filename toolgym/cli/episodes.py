"""`toolgym envs`, `play`, `eval` and `view`: environments listed, episodes watched, scored,
saved and opened in the run viewer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import toolgym
from toolgym.agents.limits import AgentLimits
from toolgym.cli.env_spec import ResolvedEnv, read_rows, resolve_env
from toolgym.cli.errors import CLIError
from toolgym.cli.terminal import escape_log_output, terminal_text
from toolgym.sandbox import BACKENDS

ENV_HELP = (
    "a registered id (e.g. Wordle-v0), path/to/file.py:Class, or module:attr (an environment "
    "class or a factory)"
)
"""The help of every command's ENV argument."""


def list_environments(args: argparse.Namespace) -> int:
    """`toolgym envs`: the registered ids (and their tools)."""
    for env_id in toolgym.list_envs(namespace=args.namespace):
        spec = toolgym.spec(env_id)
        print(terminal_text(f"{env_id:24} {spec.description or ''}".rstrip()))
        if args.tools and spec.per_row:
            print(terminal_text(f"{'':26}(its tools depend on each row)"))
        elif args.tools:  # schemas come from the class: no sandbox is started to read them
            env = toolgym.make(env_id, sandbox="local")
            try:
                tools = env.tools
            finally:
                env.close()
            for tool in tools:
                function = tool["function"]
                print(terminal_text(f"{'':26}{function['name']}: {function['description']}"))
    return 0


def build_agent(args: argparse.Namespace) -> Any:
    """The agent the CLI's arguments describe: `--model`'s tokenizer, and the engine of
    `--engine` (transformers, or vLLM in this process) or `--server` (vLLM servers)."""
    from toolgym.agents import Agent, SamplingParams
    from toolgym.agents.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    return Agent(
        _engine(args, tokenizer),
        tokenizer,
        parser=args.parser,
        limits=AgentLimits.from_arguments(args),
        sampling=SamplingParams(temperature=args.temperature),
        chat_template_kwargs=args.chat_template_kwargs,
    )


def _engine(args: argparse.Namespace, tokenizer: Any) -> Any:
    engine = getattr(args, "engine", "hf")
    server = getattr(args, "server", None)
    if server:
        from toolgym.agents.engines.server import VLLMServerEngine

        try:
            return VLLMServerEngine(server)
        except Exception as error:  # no server answers there, or not a vLLM server
            raise CLIError(f"--server {server}: {error}") from None
    if engine == "vllm":
        try:
            from toolgym.agents import VLLMEngine
            from toolgym.agents.models import resolve_model

            return VLLMEngine(resolve_model(args.model), seed=args.seed)
        except ImportError as error:
            raise CLIError(f"--engine vllm needs vLLM installed ({error})") from None
    from toolgym.agents import HFEngine
    from toolgym.agents.models import load_model

    return HFEngine(load_model(args.model).eval(), tokenizer)


def episode_rows(args: argparse.Namespace, env: ResolvedEnv, n: int) -> list[dict[str, Any]]:
    """`n` prompt rows: the first `n` of `--dataset`, or the environment's builder's."""
    if args.dataset:
        return read_rows(args.dataset)[:n]
    kwargs = {"split": args.split} if args.split else {}
    return env.dataset(n, seed=args.seed, **kwargs)


def make_envs(
    args: argparse.Namespace, env: ResolvedEnv, rows: list[dict[str, Any]], seeds: list[int]
) -> list[Any]:
    """One instance per row (an environment built per row gets its row and seed), with
    `--env-kwargs`, placed by `--sandbox`."""
    envs: list[Any] = []
    try:
        for row, seed in zip(rows, seeds, strict=True):
            envs.append(env.make(sandbox=args.sandbox, row=row, seed=seed, **args.env_kwargs))
    except TypeError as error:  # a constructor argument it does not take
        _close(envs)
        raise CLIError(f"{env.spec}: could not be built with {args.env_kwargs}: {error}") from None
    except BaseException:
        _close(envs)
        raise
    return envs


def _close(envs: list[Any]) -> None:
    for env in envs:
        env.close()


def play(args: argparse.Namespace) -> int:
    """`toolgym play`: one episode, each message shown as it happens (in colour in a
    terminal), then its status line."""
    from rich.console import Console

    from toolgym.cli.show import print_message, print_outcome

    escape_log_output()  # a warning may quote the model
    env_spec = resolve_env(args.env)
    rows = episode_rows(args, env_spec, 1)
    envs = make_envs(args, env_spec, [rows[0]], [args.seed])  # before the model: fails fast
    console = Console()
    try:
        (trajectory,) = build_agent(args).run(
            envs,
            rows,
            seeds=[args.seed],
            on_message=lambda _, message: print_message(message, console),
        )
    finally:
        _close(envs)
    print_outcome(trajectory, console)
    return 0


def format_summary(env_id: str, s: dict[str, Any]) -> str:
    """The summary as one line of text (and the environment's skill metrics, per episode),
    safe for a terminal (metric names are the environment's text)."""
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
    skills = "".join(f"; {name} {value:.2f}" for name, value in s["env"].items())
    return terminal_text(
        f"{env_id}: {s['episodes']} episodes, success rate {s['success_rate']:.1%}, mean reward "
        f"{s['reward']:.3f}, mean turns {s['turns']:.2f}, tool calls per episode "
        f"{s['tool_calls']:.2f} ({s['tool_failures']:.2f} failed); statuses: {statuses}{skills}"
    )


def view(args: argparse.Namespace) -> int:
    """`toolgym view`: serve a run folder or a trajectories JSONL in the browser."""
    from toolgym.viewer import serve

    if not Path(args.path).exists():
        raise CLIError(f"{args.path!r} does not exist")
    try:
        serve(args.path, port=args.port, tokenizer=args.tokenizer, open_browser=args.open)
    except OSError as error:  # the port is taken, or not ours to bind
        raise CLIError(
            f"cannot serve on port {args.port}: {error} (--port 0 picks a free one)"
        ) from None
    return 0


def json_object(text: str) -> dict[str, Any]:
    """A command-line word parsed as a JSON object (for `--env-kwargs` and the like)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_env_arguments(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    """ENV, `--env-kwargs` and `--dataset`: what every episode-playing command takes (ENV
    may be left out where the command can do without, `optional`)."""
    parser.add_argument("env", metavar="ENV", help=ENV_HELP, nargs="?" if optional else None)
    parser.add_argument(
        "--env-kwargs",
        type=json_object,
        default={},
        metavar="JSON",
        help="constructor arguments of the environment, e.g. '{\"max_turns\": 4}'",
    )
    parser.add_argument(
        "--dataset",
        metavar="FILE.jsonl",
        help="prompt rows, one JSON object per line: 'prompt' (text or chat messages) and the "
        "reset() arguments (default: the environment's registered dataset builder)",
    )


def add_agent_arguments(parser: argparse.ArgumentParser, optional_env: bool = False) -> None:
    """The arguments `play` and `eval` share (the limits come from `AgentLimits`)."""
    add_env_arguments(parser, optional_env)
    parser.add_argument("--model", default="smollm2-135m", help="hub id, folder, or smollm2-135m")
    parser.add_argument(
        "--engine",
        default="hf",
        choices=["hf", "vllm"],
        help="transformers, or vLLM in this process (installed separately)",
    )
    parser.add_argument(
        "--server",
        metavar="URL",
        help="generate on vLLM servers at URL (comma-separated; --model names the tokenizer)",
    )
    parser.add_argument(
        "--parser", default="auto", help="tool-call parser (auto, hermes, vllm:<name>, ...)"
    )
    parser.add_argument(
        "--chat-template-kwargs",
        type=json_object,
        default={},
        metavar="JSON",
        help="template variables as JSON, e.g. '{\"enable_thinking\": false}'",
    )
    AgentLimits.add_arguments(parser)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default=None, help="dataset split, for builders that have one")
    parser.add_argument(
        "--sandbox",
        default=None,
        choices=list(BACKENDS),
        help="where the environments live (default: the environment's registered choice; "
        "local for a class)",
    )


def add_episode_commands(commands: Any) -> None:
    """The `envs`, `play` and `view` subcommands (`eval`: `toolgym.cli.evaluate`)."""
    envs = commands.add_parser("envs", help="list registered environments")
    envs.add_argument("--namespace", help="only ids of this namespace")
    envs.add_argument("--tools", action="store_true", help="also list each environment's tools")
    envs.set_defaults(handler=list_environments)
    play_parser = commands.add_parser("play", help="watch a model play one episode")
    add_agent_arguments(play_parser)
    play_parser.set_defaults(handler=play)
    view_parser = commands.add_parser(
        "view", help="open a run folder or a trajectories JSONL in the run viewer (browser)"
    )
    view_parser.add_argument(
        "path",
        metavar="PATH",
        help="a run folder (--output-dir of train) or a trajectories JSONL (eval --output)",
    )
    view_parser.add_argument(
        "--port", type=int, default=8765, help="port on 127.0.0.1 (0: a free one)"
    )
    view_parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for the token view (default: the run's own)",
    )
    view_parser.add_argument("--open", action="store_true", help="open it in a browser")
    view_parser.set_defaults(handler=view)
