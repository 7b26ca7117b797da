"""Train an agent program as it is written: GRPO where each episode is an OpenAI-client loop.

The agent below is what people already have: an async `openai` client calling
`chat.completions.create` with the environment's tools, running the calls itself and sending
the results back, until the model answers or the game ends. It never sees a token id.
`program_rollout` runs it against an OpenAI-compatible endpoint over the trainer's own engine,
one session per episode; the endpoint records exactly what the policy saw and sampled (the
sampled ids of each assistant turn kept as sampled, the tool results as the template writes
them), and GRPO trains on that record. The game is Wordle; the reward is the environment's.

With no arguments this runs on the CPU with SmolLM2-135M-Instruct, as `examples/wordle.py`
does (a supervised warm-up on the expert's games, loaded from the cache when it ran before;
held-out games greedy and sampled; GRPO under a time budget; the same games again; a summary
table, `rewards.png`, the stage table); only the episodes are played differently.

    python examples/harness.py              # CPU default: SmolLM2-135M
    python examples/harness.py --quick      # a tiny random model taught to call tools, in CI
"""

from __future__ import annotations

import argparse
import json
import time

import openai
from wordle import apply_budget, build_parser, config_from, evaluate, finish, warm_up

import toolgym
from toolgym.agents.program import program_rollout
from toolgym.algorithms import GRPOTrainer


async def openai_agent(base_url: str, api_key: str, row: dict, env) -> float | None:
    """An agent loop over the `openai` client, as written for any OpenAI-compatible server.
    It sets no temperature: the endpoint samples at the run's own (greedy in a greedy
    evaluation)."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(row["prompt"])
        for _ in range(6):
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=env.tools
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break  # an answer in words: the game is over
            for call in message.tool_calls:
                try:
                    arguments = json.loads(call.function.arguments)
                except json.JSONDecodeError as error:
                    content = f"Error: the arguments are not JSON: {error}"
                else:
                    step = await env.astep([toolgym.ToolCall(call.function.name, arguments)])
                    content = step.messages[0]["content"]
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
            if env.done:
                break
    return None  # the environment's reward scores the game


def parser() -> argparse.ArgumentParser:
    parser = build_parser()
    parser.description = __doc__
    # on-policy, as measured (the Wordle example's pipelining is untried with agent programs);
    # 32 held-out games in both modes, as measured (this example plans no budget for them);
    # no invalid-call reward: an agent program parses and calls the tools itself
    parser.set_defaults(
        output_dir="runs/harness",
        max_staleness=0,
        eval_games=32,
        greedy_share=1.0,
        invalid_call_reward=0.0,
    )
    return parser


def tool_caller(steps: int = 100) -> tuple[object, object]:
    """The tiny tool caller for `--quick`: a random Llama-shaped model of a few hundred
    thousand parameters and a byte-level tokenizer (both built offline), fitted to one of the
    expert's games, so that it writes tool calls (the same guesses whatever the word)."""
    import torch

    from toolgym.algorithms import demonstrations, episode_factory
    from toolgym.testing import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    rows = toolgym.spec("Wordle-v0").dataset(1, seed=2, split="train")
    (game,) = demonstrations(episode_factory("Wordle-v0"), rows, tokenizer, parser="hermes")
    sequence = torch.tensor([game.prompt_ids + game.completion_ids])
    labels = sequence.clone()
    labels[0, : len(game.prompt_ids)] = -100  # the game's own turns and results, not the prompt
    torch.manual_seed(0)
    model = tiny_model(tokenizer, seed=1, hidden_size=64).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        model(sequence, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), tokenizer


def main() -> None:
    args = parser().parse_args()
    model, tokenizer = args.model, None
    if args.quick:
        args.steps, args.prompts_per_step, args.num_generations = 2, 1, 2
        args.warmup_games, args.eval_games, args.time_budget = 0, 4, 0
        args.engine, args.learning_rate, args.bf16 = "hf", 1e-4, False
        args.gradient_checkpointing = False
        started = time.perf_counter()
        model, tokenizer = tool_caller()
        seconds = time.perf_counter() - started
        print(f"the tiny tool caller, fitted to one expert game in {seconds:.1f} s")
    started = time.perf_counter()
    spec = toolgym.spec("Wordle-v0")
    config = config_from(args)
    if args.quick:
        config.parser = "hermes"
    trainer = GRPOTrainer(
        model,
        "Wordle-v0",
        spec.dataset(2000, seed=args.seed, split="train"),
        args=config,
        tokenizer=tokenizer,
        eval_dataset=spec.dataset(args.eval_games, seed=args.seed + 1, split="test"),
        env_kwargs={"shaping": args.shaping},
        rollout_fn=program_rollout(openai_agent, timeout=300),
    )
    if args.warmup_games:
        demos = spec.dataset(args.warmup_games, seed=args.warmup_seed, split="train")
        warm_up(trainer, demos, args)
    before = evaluate(trainer, "before", trainer.eval_rows, args.greedy_share)
    if args.time_budget:
        apply_budget(trainer, args.time_budget, time.perf_counter() - started)
    trainer.train()
    print(f"GRPO: {trainer.step} steps ({trainer.stopped_by}), every episode an openai-client loop")
    after = evaluate(trainer, "after", trainer.eval_rows, args.greedy_share)
    finish(trainer, before, after)


if __name__ == "__main__":
    main()
