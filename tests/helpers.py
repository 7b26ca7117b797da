"""Helpers shared by the rollout tests (HF and vLLM engines)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from pathlib import Path

import torch

import toolgym
from toolgym.agents import Agent, AgentLimits, ScriptedEngine, Trajectory
from toolgym.testing import tiny_model

GUESS = (
    '<tool_call>\n{{"name": "guess", "arguments": {{"word": "{word}"}}}}\n</tool_call><|im_end|>'
)


def run_group(command: list[str], timeout: float, **options) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)` whose processes are all
    killed when it ends, times out or the test is interrupted: its own process group, and
    every process carrying its tag in the environment (`accelerate launch` starts each rank
    in a session of its own, out of the launcher's group)."""
    tag = uuid.uuid4().hex
    env = {**options.pop("env", os.environ), RUN_TAG: tag}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
        **options,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        kill_tagged(tag)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


RUN_TAG = "TOOLGYM_TEST_RUN"
"""The environment variable that marks the processes of one `run_group` call."""


def tagged(tag: str) -> list[int]:
    """The processes whose environment carries `RUN_TAG=tag`."""
    marker = f"{RUN_TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def kill_tagged(tag: str) -> None:
    for pid in tagged(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def assert_token_exact(agent: Agent, trajectory: Trajectory, tools: list[dict]) -> None:
    """Prompt + completion ids decode to the template's rendering of the messages, every
    observation segment is exactly the template's tokens, and the mask marks sampled tokens."""
    rendered = agent.renderer.render(trajectory.template_messages(), tools)
    decoded = agent.tokenizer.decode(
        trajectory.prompt_ids + trajectory.completion_ids, skip_special_tokens=False
    )
    assert rendered.startswith(decoded)
    template_ids = ids(agent.tokenizer, rendered)
    assert template_ids[: len(trajectory.prompt_ids)] == trajectory.prompt_ids
    # Observation tokens (mask 0) sit at the same place in the template's own tokenization.
    offset = len(trajectory.prompt_ids)
    sampled_text_matches = agent.tokenizer.decode(
        trajectory.completion_ids
    ) == agent.tokenizer.decode(template_ids[offset : offset + len(trajectory.completion_ids)])
    assert sampled_text_matches
    assert len(trajectory.loss_mask) == len(trajectory.completion_ids) == len(trajectory.logprobs)
    assert set(trajectory.loss_mask) <= {0, 1}


def scripted_agent(tokenizer, replies, **limits) -> Agent:
    engine = ScriptedEngine([ids(tokenizer, r) for r in replies])
    return Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(**limits))


def wordle_rows(n: int, answer: str = "crane") -> list[dict]:
    return [{**row, "answer": answer} for row in toolgym.spec("Wordle-v0").dataset(n, seed=0)]


def train_tool_caller(tokenizer, hidden_size: int = 64):
    """A tiny random model trained on a scripted Wordle game until greedy decoding replays it:
    real tool calls turn after turn. Training stops once every token the model writes in the
    script is its argmax by a clear margin (checked teacher-forced, which is what greedy
    decoding of the same prefix does), so no machine's float kernels decide the test."""
    replies = [GUESS.format(word=w) for w in ("slate", "moist", "crane")]
    agent = scripted_agent(tokenizer, replies)
    (script,) = agent.run([toolgym.make("Wordle-v0")], wordle_rows(1))
    model = tiny_model(tokenizer, seed=1, hidden_size=hidden_size)
    sequence = torch.tensor([script.prompt_ids + script.completion_ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(1, 1001):
        model.train()
        model(sequence, labels=sequence).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= 150 and step % 25 == 0 and _replays(model, script):
            return model.eval()
    raise AssertionError("the tiny model did not learn to replay the scripted game")


def _replays(model, script: Trajectory, margin: float = 2.0) -> bool:
    """Whether each token the model wrote in `script` wins its position's argmax by `margin`
    logits, given the script's prefix."""
    model.eval()
    sequence = torch.tensor([script.prompt_ids + script.completion_ids])
    with torch.no_grad():
        logits = model(sequence).logits[0, :-1].float()
    start = len(script.prompt_ids) - 1  # logits at i predict token i + 1
    written = [start + i for i, mask in enumerate(script.loss_mask) if mask]
    targets = sequence[0, 1:][written]
    chosen = logits[written].gather(1, targets[:, None])[:, 0]
    rivals = logits[written].scatter(1, targets[:, None], float("-inf")).max(dim=1).values
    return bool((chosen - rivals > margin).all())


def greedy_agent(engine, tokenizer, parser: str = "auto") -> Agent:
    """The agent the end-to-end tests use: greedy, up to 6 turns of 40 tokens."""
    from toolgym.agents import SamplingParams

    return Agent(
        engine,
        tokenizer,
        parser=parser,
        sampling=SamplingParams(temperature=0),
        limits=AgentLimits(max_turns=6, max_new_tokens=40),
    )


def play_wordle_token_exact(agent: Agent, episodes: int) -> list[Trajectory]:
    """Play Wordle episodes and check each: real tool calls, both mask values, token
    exactness against the template, and sampled logprobs that are log-probabilities."""
    envs = [toolgym.make("Wordle-v0") for _ in range(episodes)]
    trajectories = agent.run(envs, wordle_rows(episodes))
    for trajectory in trajectories:
        assert trajectory.metrics["tool_calls"] >= 2, trajectory.messages
        assert 0 in trajectory.loss_mask and 1 in trajectory.loss_mask
        assert_token_exact(agent, trajectory, envs[0].tools)
        sampled = [lp for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m]
        assert all(lp <= 0.0 for lp in sampled)
    return trajectories


def inline_agent(tokenizer, replies: list[str], **limits) -> Agent:
    engine = ScriptedEngine([ids(tokenizer, r) for r in replies], tokenizer=tokenizer)
    return Agent(engine, tokenizer, limits=AgentLimits(**limits))


def one_grpo_step(env, rows, output_dir, max_turns=2, max_new_tokens=24, max_tokens=300) -> dict:
    """One GRPO step of the tiny offline model against `env` (one prompt, a group of two);
    the step's metrics."""
    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.testing import tiny_tokenizer

    args = GRPOConfig(
        output_dir=str(output_dir),
        max_steps=1,
        prompts_per_step=1,
        num_generations=2,
        micro_batch_size=2,
        limits=AgentLimits(
            max_turns=max_turns, max_new_tokens=max_new_tokens, max_episode_tokens=max_tokens
        ),
        parser="hermes",
        progress_bar=False,
    )
    tokenizer = tiny_tokenizer()
    trainer = GRPOTrainer(tiny_model(tokenizer), env, rows, args=args, tokenizer=tokenizer)
    (metrics,) = trainer.train()
    return metrics


def tiny_grpo_args(output_dir, **overrides):
    """A one-step GRPO test's configuration: one prompt, a group of two in one micro-batch,
    the hermes parser, no progress bar and no checkpoint; `overrides` change or add fields."""
    from toolgym.algorithms import GRPOConfig

    options = {
        "output_dir": str(output_dir),
        "max_steps": 1,
        "prompts_per_step": 1,
        "num_generations": 2,
        "micro_batch_size": 2,
        "parser": "hermes",
        "progress_bar": False,
        "save_steps": 0,
    }
    return GRPOConfig(**{**options, **overrides})


def trained_step(trainer, output_dir):
    """One step of `trainer` (closed after it, also on failure); its metrics, checked for a
    finite loss, and the step's trajectories as written to `samples.jsonl`."""
    import math

    from toolgym.agents import load_jsonl

    try:
        (metrics,) = trainer.train()
    finally:
        trainer.close()
    assert math.isfinite(metrics["loss"]), metrics["loss"]
    return metrics, load_jsonl(Path(output_dir) / "samples.jsonl")


def float64_norms(model: torch.nn.Module) -> None:
    """Make the RMS norms compute in the input's precision: transformers' norms cast to float32
    even in a float64 model, whose rounding (about 1e-7 relative) would otherwise bound the
    comparison, as it bounds the plain path's own regrouping (rows one by one vs batched)."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))

            def forward(x: torch.Tensor, module: torch.nn.Module = module, eps: float = eps):
                normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
                return module.weight * normed

            module.forward = forward  # type: ignore[method-assign]


async def three_turns(ctx, env):
    """A rollout function: three generations in one episode, whatever the model writes."""
    trajectory = ctx.start()
    for _ in range(3):
        await ctx.generate(trajectory)
        ctx.observe(trajectory, " and then?")
    return trajectory
