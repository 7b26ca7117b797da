"""The `toolgym` command (also `python -m toolgym`, and `accelerate launch -m toolgym train`).

toolgym envs [--tools]                               registered environments (and their tools)
toolgym play Wordle-v0 --model smollm2-135m          watch a model play one episode
toolgym eval Wordle-v0 --model smollm2-135m -n 8     success rate, reward, turns, statuses
    [--rollouts 4] [--report r.json]                 ... pass@k and mean@k with standard errors
    [--output episodes.jsonl [--resume]]             ... the trajectories, for `view` and resume
    [--engine vllm | --server URL]                   ... on vLLM in-process or vLLM servers
toolgym eval --compare base.json new.json            two reports, paired row by row
toolgym train Wordle-v0 --model smollm2-135m [--config run.yaml] [--max-steps 30 ...]
                                                     GRPO / RLOO, every GRPOConfig field a flag
toolgym view runs/grpo [--port 8765] [--open]        the run viewer (a run folder or a JSONL)
toolgym endpoint --model smollm2-135m [--port 8000]  an OpenAI-compatible endpoint that
                                                     records exact tokens per session
toolgym serve Wordle-v0 --protocol mcp [--stdio]     an environment as an MCP server, one
                                                     instance per client session
toolgym accelerate-config multi-node-ddp             the path of a shipped accelerate config,
                                                     for `accelerate launch --config_file`

ENV is a registered id (Wordle-v0), path/to/file.py:Class or module:attr (an environment
class or a factory); ids registered in a file are usable by name after `--import file.py`
(toolgym --import envs.py eval MyEnv-v0); `toolgym COMMAND --help` for each command's options.
"""

from __future__ import annotations

import argparse
import os
import select
import sys

from toolgym.cli.endpoint import add_endpoint_command
from toolgym.cli.env_spec import import_registrations
from toolgym.cli.episodes import add_episode_commands
from toolgym.cli.errors import CLIError
from toolgym.cli.evaluate import add_eval_command
from toolgym.cli.multinode import add_accelerate_config_command
from toolgym.cli.serve import add_serve_command
from toolgym.cli.terminal import terminal_text
from toolgym.cli.train import add_train_command

__all__ = ["CLIError", "build_parser", "main"]


def build_parser(train_flags: bool = True) -> argparse.ArgumentParser:
    """The `toolgym` argument parser; `train_flags=False` leaves the generated `train` flags
    out (they import the trainer: torch and transformers)."""
    parser = argparse.ArgumentParser(
        prog="toolgym", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="a Python file (path/to/envs.py) or module whose toolgym.register(...) calls make "
        "ids usable by name in the command (repeatable): toolgym --import envs.py eval MyEnv-v0",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_episode_commands(commands)
    add_eval_command(commands)
    add_train_command(commands, with_config_flags=train_flags)
    add_endpoint_command(commands)
    add_serve_command(commands)
    add_accelerate_config_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `toolgym` command; its exit code (2, with a one-line message, for bad input)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(train_flags=bool(argv) and argv[0] == "train")
    args = parser.parse_args(argv)
    try:
        for location in args.imports:
            import_registrations(location)
        code = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except CLIError as error:
        print(f"toolgym {args.command}: error: {terminal_text(error)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a socket, a subprocess): not the reader leaving
        devnull = os.open(os.devnull, os.O_WRONLY)  # `toolgym envs | head`: end quietly
        os.dup2(devnull, sys.stdout.fileno())  # nothing more to flush into the closed pipe
        return 1


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on
    its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll, or no descriptor
        return False
