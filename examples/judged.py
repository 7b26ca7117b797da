"""A reward no program can compute: a judge model grades each answer against a rubric.

`Definitions` asks for a word's meaning in one plain sentence; a `dictionary` tool gives the
entry, but copying it is not what is asked. The environment has no reward of its own: the
`Judge` gives it (`reward_funcs=[judge]`), scoring each episode on two weighted criteria
(right meaning, in the model's own plain words). This plays one GRPO step on one group and
prints the judge's scores, seconds per call, and one judgement (the chat and the answer, as
`toolgym view` shows them):

    python examples/judged.py                        # SmolLM2-135M plays and judges (CPU)
    python examples/judged.py --group                # the group judged in one call (RULER)
    python examples/judged.py --judge-url http://127.0.0.1:8000/v1 --judge-model NAME
    python examples/judged.py --tiny                 # tiny random models: the mechanics only
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import toolgym
from toolgym.agents import AgentLimits, load_jsonl
from toolgym.judges import Criterion, EngineClient, Judge, OpenAIClient, Rubric

WORDS = {
    "lantern": "a lamp with a transparent case protecting the flame or light",
    "harvest": "the gathering of a crop when it is ripe",
    "glacier": "a slowly moving mass of ice formed from compacted snow on mountains",
    "orchard": "a piece of land planted with fruit trees",
    "whisper": "to speak very softly using one's breath rather than one's voice",
    "compass": "an instrument with a magnetic needle that points north",
}
"""Words and their dictionary entries."""

RUBRIC = Rubric(
    (
        Criterion("meaning", "The answer gives the word's meaning correctly.", weight=2),
        Criterion("plain", "One short sentence in plain words of its own, not the entry copied."),
    ),
    guidance="The assistant may look the word up with the dictionary tool.",
)


class Definitions(toolgym.Environment):
    """Explain a word in one plain sentence; the `dictionary` tool has its entry."""

    def reset(self, word: str = "lantern", **row: Any) -> str:
        self.word = word
        return f"What does the word '{word}' mean? Answer in one plain sentence."

    def dictionary(self, word: str) -> str:
        """Look a word up.

        Args:
            word: The word to look up.
        """
        entry = WORDS.get(word.strip().lower())
        if entry is None:
            raise toolgym.ToolError(f"no entry for {word!r}")
        return entry


def definition_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` rows, each one word."""
    rng = random.Random(seed)
    return [{"prompt": "", "word": rng.choice(sorted(WORDS))} for _ in range(count)]


def make_judge(args: argparse.Namespace, model: Any, tokenizer: Any) -> Judge:
    """The judge: an OpenAI-compatible API, or the policy's own model in an engine of its own."""
    if args.judge_url:
        client: Any = OpenAIClient(args.judge_url, args.judge_model)
    else:
        from toolgym.agents import HFEngine

        client = EngineClient(HFEngine(model, tokenizer), tokenizer, max_tokens=48, name="self")
    return Judge(client, RUBRIC, mode="group" if args.group else "pointwise", timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random models (seconds)")
    parser.add_argument("--model", default="smollm2-135m", help="the policy (and judge) model")
    parser.add_argument("--episodes", type=int, default=4, help="episodes in the group")
    parser.add_argument("--group", action="store_true", help="judge the group in one call")
    parser.add_argument("--judge-url", help="an OpenAI-compatible API as the judge")
    parser.add_argument("--judge-model", default="judge", help="the model --judge-url serves")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.tiny:
        from toolgym.testing import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer)
    else:
        from toolgym.agents.models import load_model, load_tokenizer

        tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    judge = make_judge(args, model, tokenizer)
    rows = definition_rows(1, args.seed) * args.episodes
    from toolgym.algorithms import GRPOConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            max_steps=1,
            prompts_per_step=1,
            num_generations=len(rows),
            micro_batch_size=len(rows),
            limits=AgentLimits(max_turns=3, max_new_tokens=64, max_episode_tokens=600),
            parser="hermes",
            save_steps=0,
            progress_bar=False,
            env_reward=False,
        )
        trainer = GRPOTrainer(
            model, Definitions, rows, reward_funcs=[judge], args=config, tokenizer=tokenizer
        )
        started = time.perf_counter()
        try:
            (metrics,) = trainer.train()
        finally:
            trainer.close()
        seconds = time.perf_counter() - started
        episodes = load_jsonl(Path(output_dir) / "samples.jsonl")
    records = [j for t in episodes for j in t.judgements]
    print(
        f"one GRPO step of {len(rows)} episodes ({rows[0]['word']!r}): {seconds:.1f} s; "
        f"judge calls {judge.calls}, {metrics.get('judge/judge/seconds', 0.0):.2f} s each; "
        f"failures {metrics.get('judge/judge/failures', 0.0):.0f}; statuses {metrics['statuses']}"
    )
    print("scores:", [j.get("score") for j in records])
    if records:
        shown = records[0]
        print(f"first judgement ({shown['model']}): {shown.get('error') or shown.get('scores')}")
        print("  the judge answered:", repr(shown["answer"][:300]))


if __name__ == "__main__":
    main()
