"""The `toolgym` command.

toolgym envs [--tools]                         registered environments (and their tools)
toolgym play Wordle-v0 --model smollm2-135m    watch a model play one episode
toolgym eval Wordle-v0 --model smollm2-135m -n 8   success rate, reward, turns, statuses
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import toolgym
from toolgym.agents.limits import AgentLimits
from toolgym.agents.trajectory import summarize


def list_environments(args: argparse.Namespace) -> int:
    """`toolgym envs`: the registered ids (and their tools)."""
    for env_id in toolgym.list_envs(namespace=args.namespace):
        spec = toolgym.spec(env_id)
        print(f"{env_id:24} {spec.description or ''}".rstrip())
        if args.tools:  # schemas come from the class: no sandbox is started to read them
            env = toolgym.make(env_id, sandbox="local")
            try:
                tools = env.tools
            finally:
                env.close()
            for tool in tools:
                function = tool["function"]
                print(f"{'':26}{function['name']}: {function['description']}")
    return 0


def build_agent(args: argparse.Namespace) -> Any:
    """The agent the CLI's arguments describe (transformers on the CPU)."""
    from toolgym.agents import Agent, HFEngine, SamplingParams
    from toolgym.agents.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model).eval()
    limits = AgentLimits.from_arguments(args)
    sampling = SamplingParams(temperature=args.temperature)
    return Agent(
        HFEngine(model, tokenizer),
        tokenizer,
        parser=args.parser,
        limits=limits,
        sampling=sampling,
        chat_template_kwargs=args.chat_template_kwargs,
    )


def episode_rows(args: argparse.Namespace, n: int) -> list[dict[str, Any]]:
    """`n` rows of the environment's prompt dataset."""
    spec = toolgym.spec(args.env)
    kwargs = {"split": args.split} if args.split else {}
    return list(spec.dataset(n, seed=args.seed, **kwargs))


def play(args: argparse.Namespace) -> int:
    """`toolgym play`: one episode, printed message by message."""
    agent = build_agent(args)
    env = toolgym.make(args.env, sandbox=args.sandbox)
    try:
        (trajectory,) = agent.run([env], episode_rows(args, 1), seeds=[args.seed])
    finally:
        env.close()
    for message in trajectory.messages:
        print(f"--- {message['role']}")
        print(message["content"])
    turns = trajectory.metrics["turns"]
    print(f"=== status {trajectory.status}, reward {trajectory.reward:.3f}, turns {turns:.0f}")
    if trajectory.error:
        print(f"error: {trajectory.error}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """`toolgym eval`: N episodes and their summary."""
    from tqdm.auto import tqdm

    agent = build_agent(args)
    rows = episode_rows(args, args.n)
    envs = [toolgym.make(args.env, sandbox=args.sandbox) for _ in rows]
    try:
        with tqdm(total=len(rows), desc=f"eval {args.env}", unit="episode") as bar:
            trajectories = agent.run(
                envs,
                rows,
                seeds=list(range(args.seed, args.seed + len(rows))),
                on_episode_end=lambda _: bar.update(),
            )
    finally:
        for env in envs:
            env.close()
    summary = summarize(trajectories, args.success_threshold)
    print(json.dumps(summary, indent=2) if args.json else format_summary(args.env, summary))
    return 0


def format_summary(env_id: str, s: dict[str, Any]) -> str:
    """The summary as one line of text."""
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
    return (
        f"{env_id}: {s['episodes']} episodes, success rate {s['success_rate']:.1%}, mean reward "
        f"{s['reward']:.3f}, mean turns {s['turns']:.2f}, tool calls per episode "
        f"{s['tool_calls']:.2f} ({s['tool_failures']:.2f} failed); statuses: {statuses}"
    )


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `play` and `eval` share (the limits come from `AgentLimits`)."""
    parser.add_argument("env", help="a registered environment id, e.g. Wordle-v0")
    parser.add_argument("--model", default="smollm2-135m", help="hub id, folder, or smollm2-135m")
    parser.add_argument(
        "--parser", default="auto", help="tool-call parser (auto, hermes, vllm:<name>, ...)"
    )
    parser.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        default={},
        help="template variables as JSON, e.g. '{\"enable_thinking\": false}'",
    )
    AgentLimits.add_arguments(parser)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default=None, help="dataset split, for builders that have one")
    parser.add_argument(
        "--sandbox",
        default=None,
        choices=["local", "process", "docker", "auto"],
        help="where the environments live (default: the environment's registered choice)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The `toolgym` argument parser."""
    parser = argparse.ArgumentParser(
        prog="toolgym", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    envs = commands.add_parser("envs", help="list registered environments")
    envs.add_argument("--namespace", help="only ids of this namespace")
    envs.add_argument("--tools", action="store_true", help="also list each environment's tools")
    envs.set_defaults(handler=list_environments)
    play_parser = commands.add_parser("play", help="watch a model play one episode")
    add_agent_arguments(play_parser)
    play_parser.set_defaults(handler=play)
    eval_parser = commands.add_parser("eval", help="play N episodes and summarise")
    add_agent_arguments(eval_parser)
    eval_parser.add_argument("-n", type=int, default=8, help="episodes")
    eval_parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    eval_parser.add_argument(
        "--success-threshold", type=float, default=1.0, help="reward that counts as a success"
    )
    eval_parser.set_defaults(handler=evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `toolgym` command; its exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
