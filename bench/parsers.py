"""Tool-call formats over the real template corpus: coverage, detection time, parsing speed.

Prints, for the chat templates in `tests/templates/` (llama.cpp's and trl's, two independent
public packages):

- per format: templates that write tool calls in it, how many `parser="auto"` names correctly
  (the format's parser reads the template's own one- and two-call turns back exactly), and the
  prefix verdicts (prefix-preserving for every shape of turn -> one sequence; otherwise one
  sample per turn);
- the time `parser="auto"` takes per template (mean and slowest);
- the time to parse 10,000 turns per format with toolgym's parser, and with vLLM's parser for
  the same format where vLLM has one that runs on the corpus tokenizer (the peer, same texts,
  same run).

`--templates DIR` surveys the `*.jinja` files of another folder instead (e.g. vLLM's
`examples/tool_chat_template_*.jinja`); a format only vLLM's own parsers read shows as
`vllm:<name>`.

With `--hostile`, instead: per parser (every name in `PARSERS`), the worst time over the
hostile texts of `tests/hostile_text.py` (repeated opening markers with no close, long call
lists, deep nesting, unterminated JSON) at `--size` characters, and its ratio to a linear
baseline measured in the same run (`json.loads` of a JSON list of calls of the same size). A
parse that would run past `--cap` seconds is not run at full size: its time is extrapolated from
two smaller sizes (marked `~`). Speed targets are printed here, never asserted in tests.

    python bench/parsers.py [--turns 10000] [--no-vllm] [--templates DIR]
    python bench/parsers.py --hostile [--size 1048576] [--cap 30] [--show 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hostile_text import HOSTILE
from template_corpus import TEMPLATES, template_tokenizer

from toolgym.agents.chat import ChatRenderer, TemplateError
from toolgym.agents.parsers import PARSERS, Parser, detect_format, type_arguments, vllm_parser
from toolgym.agents.parsers.detect import (
    PROBE_CALLS,
    PROBE_TOOLS,
    render_probe,
    reply_candidates,
)

# vLLM's parser for the same format, and a template whose tokenizer it runs on.
VLLM_PEERS = {
    "hermes": "hermes",
    "xml_function": "qwen3_xml",
    "glm": "glm45",
    "mistral": "mistral",
    "deepseek": "deepseek_v31",
    "kimi_k2": "kimi_k2",
    "pythonic": "pythonic",
    "llama3": "llama3_json",
    "gemma4": "gemma4",
    "invoke": "minimax_m2",
    "json_calls": "xlam",
    "internlm2": "internlm",
    "granite_20b_fc": "granite-20b-fc",
    "functiongemma": "functiongemma",
}


def _parser(name: str, tokenizer) -> Parser:
    """A detected format's parser: built in, or vLLM's (`vllm:<name>`)."""
    if name.startswith("vllm:"):
        return vllm_parser(name.removeprefix("vllm:"), tokenizer, PROBE_TOOLS)
    return PARSERS[name]


def survey(templates: list[Path]) -> tuple[dict, list[float], dict[str, str]]:
    """Per format: templates, correct detections, prefix verdicts; detection times; a sample
    reply text per format."""
    table: dict[str, Counter] = defaultdict(Counter)
    times, samples = [], {}
    for path in templates:
        tokenizer = template_tokenizer(path)
        start = time.perf_counter()
        try:
            name = detect_format(tokenizer)
        except ValueError as error:
            name = "(none: " + _reason(str(error)) + ")"
        times.append(time.perf_counter() - start)
        row = table[name]
        row["templates"] += 1
        if name.startswith("(none"):
            continue
        reply = render_probe(tokenizer, 1)
        samples.setdefault(name, (reply.text, tokenizer))
        if all(_reads_back(name, tokenizer, count) for count in (1, 2)):
            row["read back"] += 1
        try:
            renderer = ChatRenderer(tokenizer)
        except TemplateError:
            row["refused"] += 1
            continue
        row["one sample per turn" if renderer.profile.per_turn else "one sequence"] += 1
    return table, times, samples


def _reads_back(name: str, tokenizer, count: int) -> bool:
    """The format's parser reads the template's own `count`-call turn back exactly (True for
    two calls where the template refuses or drops a second call)."""
    try:
        reply = render_probe(tokenizer, count)
    except ValueError:
        return count == 2
    if count == 2 and PROBE_CALLS[1][0] not in reply.text:
        return True
    texts = reply_candidates(reply.text, tokenizer)
    parser = _parser(name, tokenizer)
    return any(_read(parser, text) == PROBE_CALLS[:count] for text in texts)


def _read(parser, text: str) -> list:
    parsed = type_arguments(parser(text), PROBE_TOOLS)
    return [(getattr(c, "name", None), getattr(c, "arguments", None)) for c in parsed.tool_calls]


def _reason(message: str) -> str:
    for key in ("does not write tool calls", "cannot render", "none of the parsers"):
        if key in message:
            return key
    return message[:40]


def parse_speed(samples: dict, turns: int, with_vllm: bool) -> list[tuple[str, float, str]]:
    rows = []
    for name, (text, tokenizer) in sorted(samples.items()):
        parser = _parser(name, tokenizer)
        candidates = reply_candidates(text, tokenizer)
        text = next((t for t in candidates if _read(parser, t) == PROBE_CALLS[:1]), candidates[-1])
        start = time.perf_counter()
        for _ in range(turns):
            parser(text)
        ours = time.perf_counter() - start
        peer = "-"
        if with_vllm and name in VLLM_PEERS:
            peer = _vllm_speed(VLLM_PEERS[name], tokenizer, text, turns)
        rows.append((name, ours, peer))
    return rows


def _vllm_speed(name: str, tokenizer, text: str, turns: int) -> str:
    try:
        from toolgym.agents.parsers import vllm_parser

        parser = vllm_parser(name, tokenizer)
        if not parser(text).tool_calls:
            return "n/a (reads no call)"
    except Exception as error:  # a vLLM parser may need its model's real tokenizer
        return f"n/a ({type(error).__name__})"
    start = time.perf_counter()
    for _ in range(turns):
        parser(text)
    return f"{time.perf_counter() - start:.3f} s"


def _timed(parser, text: str) -> float:
    start = time.perf_counter()
    parser(text)
    return time.perf_counter() - start


def _worst_case_time(parser, build, size: int, cap: float) -> tuple[float, bool]:
    """`(seconds, extrapolated)` for one hostile text at `size`: timed at 8 KB, 16 KB, ...
    first; where the growth between two sizes predicts more than `cap` seconds at `size`
    (power law through the two points, exponent at least 1), the prediction instead of a run.
    Each smaller size takes the best of three runs: one pause of a busy machine would otherwise
    look like a steep growth."""
    smaller, previous = 1 << 13, None
    while smaller < size:
        text = build(smaller)
        seconds = min(_timed(parser, text) for _ in range(3))
        if previous is not None and seconds > 0.05:
            exponent = max(1.0, math.log2(seconds / max(previous, 1e-9)))
            predicted = seconds * (size / smaller) ** exponent
            if predicted > cap:
                return predicted, True
        previous, smaller = seconds, smaller * 2
    return _timed(parser, build(size)), False


def hostile(size: int, cap: float, show: int = 1) -> None:
    """Per parser, the worst time over the hostile texts at `size` characters."""
    calls = json.dumps([{"name": "f", "arguments": {"x": 1}}] * (size // 34))
    baseline = min(_timed(json.loads, calls) for _ in range(3))
    print(
        f"{len(HOSTILE)} hostile texts of {size:,} characters; linear baseline "
        f"(json.loads of {len(calls):,} characters of calls) {1e3 * baseline:.1f} ms\n"
    )
    names: dict[int, list[str]] = defaultdict(list)
    for name, parser in PARSERS.items():
        names[id(parser)].append(name)
    print(f"{'parser':44s} {'worst':>10s} {'x baseline':>11s}  worst text")
    for aliases in names.values():
        parser = PARSERS[aliases[0]]
        times = sorted(
            (*_worst_case_time(parser, build, size, cap), label) for label, build in HOSTILE.items()
        )[::-1]
        for rank, (seconds, extrapolated, label) in enumerate(times[: max(1, show)]):
            mark = "~" if extrapolated else " "
            name = " / ".join(aliases) if rank == 0 else ""
            print(
                f"{name:44s} {mark}{seconds:8.3f} s {seconds / baseline:10.0f}x  {label[:60]}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--hostile", action="store_true", help="worst times on hostile text")
    parser.add_argument("--size", type=int, default=1 << 20, help="hostile text size (chars)")
    parser.add_argument("--cap", type=float, default=30.0, help="extrapolate past this (s)")
    parser.add_argument("--show", type=int, default=1, help="slowest texts shown per parser")
    parser.add_argument("--templates", type=Path, help="survey this folder's *.jinja instead")
    args = parser.parse_args()
    if args.hostile:
        hostile(args.size, args.cap, args.show)
        return
    templates = sorted(args.templates.glob("*.jinja")) if args.templates else TEMPLATES
    table, times, samples = survey(templates)
    sources = Counter(path.parent.name for path in templates)
    print(f"{len(templates)} templates ({dict(sources)})\n")
    columns = [
        "templates",
        "read back",
        "one sequence",
        "one sample per turn",
        "refused",
    ]
    print(f"{'format':42s}" + "".join(f"{c[:14]:>16s}" for c in columns))
    for name in sorted(table, key=lambda n: (n.startswith("("), -table[n]["templates"])):
        print(f"{name:42s}" + "".join(f"{table[name][c]:>16d}" for c in columns))
    totals = Counter()
    for name, row in table.items():
        if not name.startswith("("):
            totals.update(row)
    print(f"{'all formats':42s}" + "".join(f"{totals[c]:>16d}" for c in columns))
    print(
        f"\nauto-detection: mean {1e3 * sum(times) / len(times):.1f} ms, "
        f"slowest {1e3 * max(times):.1f} ms per template"
    )
    print(f"\nparsing {args.turns} one-call turns (toolgym vs vLLM's parser for the format):")
    for name, ours, peer in parse_speed(samples, args.turns, not args.no_vllm):
        print(f"  {name:18s} toolgym {ours:.3f} s   vLLM {peer}")


if __name__ == "__main__":
    main()
