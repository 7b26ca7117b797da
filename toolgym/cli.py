"""The `toolgym` command. `toolgym envs` lists the registered environments and their tools."""

from __future__ import annotations

import argparse
import sys

import toolgym


def list_environments(args: argparse.Namespace) -> int:
    for env_id in toolgym.list_envs(namespace=args.namespace):
        spec = toolgym.spec(env_id)
        print(f"{env_id:24} {spec.description or ''}".rstrip())
        if args.tools:
            for tool in toolgym.make(env_id).tools:
                function = tool["function"]
                print(f"{'':26}{function['name']}: {function['description']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolgym", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    envs = commands.add_parser("envs", help="list registered environments")
    envs.add_argument("--namespace", help="only ids of this namespace")
    envs.add_argument("--tools", action="store_true", help="also list each environment's tools")
    envs.set_defaults(handler=list_environments)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
