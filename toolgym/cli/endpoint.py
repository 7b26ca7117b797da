"""`toolgym endpoint`: serve a model as an OpenAI-compatible endpoint that records exact tokens
(`toolgym.agents.endpoint`), for agent programs written against the `openai` client."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from toolgym.agents.limits import AgentLimits
from toolgym.cli.errors import CLIError


def serve_endpoint(args: argparse.Namespace) -> int:
    """Serve until interrupted; prints the base URL first (flushed, for scripts to read)."""
    from toolgym.agents.endpoint import Endpoint
    from toolgym.agents.models import load_tokenizer

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
    parser.add_argument("--host", default="127.0.0.1", help="where to listen (loopback)")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--model-name", default=None, help="the name /v1/models lists")
    AgentLimits.add_arguments(parser)
    parser.set_defaults(handler=serve_endpoint)
