"""One GRPO step, top to bottom: rows -> episodes -> rewards -> advantages -> loss -> update.

What `GRPOTrainer` does at every step, written out with toolgym's parts and nothing else:
the orchestration it adds (a vLLM engine and its weight sync, several processes, pipelined
steps, micro-batches, checkpoints, metrics) is left out. Read it in one sitting; each part
named here is one file (docs/DESIGN.md, "One GRPO step").

    python examples/one_step.py           # SmolLM2-135M on Wordle, on the CPU
    python examples/one_step.py --tiny    # a tiny random model: only the mechanics (seconds)
"""

from __future__ import annotations

import argparse

import torch

import toolgym
from toolgym.agents import Agent, AgentLimits, HFEngine, SamplingParams
from toolgym.algorithms.advantages import group_advantages, trainable
from toolgym.algorithms.batch import collate, training_samples
from toolgym.algorithms.losses import StepNormalizer, policy_loss, token_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (seconds)")
    parser.add_argument("--prompts", type=int, default=2, help="groups in the step")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    # 1. The policy: a causal LM and its tokenizer (the chat template must render tool calls).
    if args.tiny:
        from toolgym.testing import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer)
    else:
        from toolgym.agents.models import load_model, load_tokenizer

        tokenizer, model = load_tokenizer("smollm2-135m"), load_model("smollm2-135m")
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

    # 2. The agent: an engine that samples from the policy (here the policy itself, through
    #    transformers), the chat template rendered to exact token ids, the tool-call parser
    #    and the episode's limits. (toolgym.agents.rollout: Agent; agents/chat.py: the ids.)
    agent = Agent(
        HFEngine(model, tokenizer),
        tokenizer,
        limits=AgentLimits(max_turns=6, max_new_tokens=40, max_episode_tokens=700),
        sampling=SamplingParams(temperature=1.0),
    )

    # 3. The step's rows: each prompt played `group_size` times with the same seed (a group),
    #    each episode on its own environment instance (toolgym.make: registry.py, envs/).
    prompts = toolgym.spec("Wordle-v0").dataset(args.prompts, seed=args.seed)
    rows = [dict(row) for row in prompts for _ in range(args.group_size)]
    seeds = [index // args.group_size for index in range(len(rows))]
    envs = [toolgym.make("Wordle-v0") for _ in rows]

    # 4. Play: the model writes a turn, its tool calls run on the environment, their results
    #    are appended as the template's own tokens (mask 0), until the game ends or a limit.
    #    Each episode is a Trajectory: token ids, a loss mask, the engine's logprobs, the
    #    environment's reward and how it ended. (agents/rollout_functions.py: chat_rollout.)
    model.eval()
    trajectories = agent.run(envs, rows, seeds)
    for env in envs:
        env.close()

    # 5. Advantages: each episode's reward against its group's mean, divided by the group's
    #    standard deviation; episodes that failed for the infrastructure's reasons are left
    #    out (`used` False). (algorithms/advantages.py)
    rewards = [trajectory.reward or 0.0 for trajectory in trajectories]
    valid = [trainable(trajectory) for trajectory in trajectories]
    advantages, used = group_advantages(rewards, valid, args.group_size)

    # 6. A batch: every sample's prompt and completion ids padded into one tensor, the loss
    #    mask 1 only on tokens the model sampled (never on tool results), the advantage per
    #    token. (algorithms/batch.py)
    batch = collate(training_samples(trajectories, advantages, used), tokenizer.pad_token_id)
    mask, sampling_logprobs, tokens = batch.targets()  # positions 1..L-1: what was predicted

    # 7. The loss: the logprob of each sampled token under the policy now, against the one it
    #    had when sampled (the clipped ratio), times its advantage, averaged over the step's
    #    sampled tokens ("dapo"). One pass: the old logprobs are this pass's, detached.
    #    (algorithms/losses.py: token_logprobs, policy_loss)
    model.train()
    logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=1.0)
    normalizer = StepNormalizer(
        sequences=int(used.sum()), tokens=float(tokens), micro_batches=1, max_tokens=700
    )
    loss, stats = policy_loss(
        logprobs,
        logprobs.detach(),
        batch.token_advantages[:, 1:],
        mask,
        normalizer,
        sampling_logprobs=sampling_logprobs,
        loss_type="dapo",
    )

    # 8. The update: gradients, clipped to norm 1, one optimizer step. A trainer then hands
    #    the new weights to its engine (GRPOTrainer: engine_choice.sync_weights).
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    statuses: dict[str, int] = {}
    for trajectory in trajectories:
        statuses[trajectory.status] = statuses.get(trajectory.status, 0) + 1
    print(f"episodes {len(trajectories)}: {statuses}")
    print(f"rewards {[round(r, 3) for r in rewards]}")
    print(f"advantages {[round(float(a), 3) for a in advantages]}")
    print(
        f"sampled tokens {int(tokens)} of {int(batch.attention_mask.sum())} in the batch; "
        f"loss {loss.item():.4f}; grad norm {float(grad_norm):.3f}; "
        f"engine/trainer KL {stats.get('mismatch_kl', float('nan')):.4f}"
    )


if __name__ == "__main__":
    main()
