"""`toolgym endpoint`: serve a model as an OpenAI-compatible endpoint that records exact tokens
(`toolgym.agents.endpoint`), for agent programs written against the `openai` client.

Any API key names a session of its own: at most `--max-sessions` at once (a new key past them
gets 429), each forgotten after `--session-idle-timeout` idle seconds. It listens on loopback,
refuses foreign Host and Origin headers and non-JSON bodies; beyond loopback every request
needs the token (`--token`, `$TOOLGYM_TOKEN`, or one made and printed on stderr), sent as the
API key (`TOKEN`, or `TOKEN:SESSION` to name a session) or as `X-Toolgym-Token`."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from toolgym.agents.limits import AgentLimits
from toolgym.cli.errors import CLIError
from toolgym.cli.listening import add_listening_arguments, checked_limits, token_for


def serve_endpoint(args: argparse.Namespace) -> int:
    """Serve until interrupted; prints the base URL first (flushed, for scripts to read)."""
    from toolgym.agents.endpoint import Endpoint
    from toolgym.agents.models import load_tokenizer

    checked_limits(args)
    token = token_for(args, "endpoint")
    tokenizer = load_tokenizer(args.model)
    endpoint = Endpoint(
        _engine(args, tokenizer),
        tokenizer,
        parser=args.parser,
        limits=AgentLimits.from_arguments(args),
        host=args.host,
        port=args.port,
        model_name=args.model_name or args.model,
        open_sessions=True,  # any API key names a session of its own
        token=token,
        max_sessions=args.max_sessions,
        session_idle_timeout=args.session_idle_timeout,
    )
    try:
        print(endpoint.start(), flush=True)
    except RuntimeError as error:
        raise CLIError(str(error)) from None
    try:
        threading.Event().wait()  # until Ctrl-C or SIGTERM
    except KeyboardInterrupt:
        pass
    finally:
        endpoint.close()
    return 0


def _engine(args: argparse.Namespace, tokenizer: Any) -> Any:
    if args.engine == "hf":
        from toolgym.agents import HFEngine
        from toolgym.agents.models import load_model

        return HFEngine(load_model(args.model).eval(), tokenizer)
    if args.engine == "vllm":
        from toolgym.agents import VLLMEngine

        return VLLMEngine(args.model)
    from toolgym.agents import VLLMServerEngine

    return VLLMServerEngine(args.engine, model=args.model)


def add_endpoint_command(commands: Any) -> None:
    """The `endpoint` subcommand."""
    parser = commands.add_parser(
        "endpoint",
        help="serve a model as an OpenAI-compatible endpoint that records exact tokens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2-135m", help="hub id, folder, or smollm2-135m")
    parser.add_argument(
        "--engine",
        default="hf",
        metavar="hf|vllm|URL",
        help="transformers in this process (hf), vLLM in this process (vllm), or a running "
        "vLLM server's URL",
    )
    parser.add_argument("--parser", default="auto", help="tool-call parser (auto, hermes, ...)")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    add_listening_arguments(parser, max_sessions=256)
    parser.add_argument("--model-name", default=None, help="the name /v1/models lists")
    AgentLimits.add_arguments(parser)
    parser.set_defaults(handler=serve_endpoint)
