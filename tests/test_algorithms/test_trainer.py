"""GRPOTrainer / RLOOTrainer end to end on a tiny model: warm-up, steps, rewards, resume."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from helpers import train_tool_caller

import toolgym
from toolgym.agents import AgentLimits
from toolgym.agents.trajectory import load_jsonl
from toolgym.algorithms import GRPOConfig, GRPOTrainer, RLOOTrainer, SFTConfig
from toolgym.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def config(tmp_path, **overrides) -> GRPOConfig:
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=3,
        prompts_per_step=2,
        num_generations=3,
        micro_batch_size=4,
        limits=AgentLimits(max_turns=3, max_new_tokens=60, max_episode_tokens=400),
        parser="hermes",
        learning_rate=1e-3,
        batch_wait=60.0,  # reproducible batches, so sampling replays exactly after a resume
        progress_bar=False,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def rows(count: int, seed: int = 0) -> list[dict]:
    return list(toolgym.spec("Wordle-v0").dataset(count, seed=seed))


def valid_guesses(prompts, completions, trajectories, **_):
    return [t.metrics["tool_calls"] - t.metrics["tool_failures"] for t in trajectories]


def length_mod_7(prompts, completions, trajectories, **_):
    """A reward that varies within a group whenever completion lengths do."""
    return [float(len(t.completion_ids) % 7) for t in trajectories]


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
def test_resume_from_checkpoint_repeats_the_same_steps(tokenizer, tmp_path):
    def trainer(folder):
        torch.manual_seed(0)
        model = train_tool_caller(tokenizer)
        args = config(folder, save_steps=1, env_reward=False, temperature=0.8)
        return GRPOTrainer(
            model,
            "Wordle-v0",
            rows(6),
            reward_funcs=[valid_guesses],
            args=args,
            tokenizer=tokenizer,
        )

    first = trainer(tmp_path / "a")
    history = first.train()
    assert any(m["reward_std"] > 0 for m in history), "no reward signal to compare"
    second = trainer(tmp_path / "b")
    resumed = second.train(resume_from_checkpoint=tmp_path / "a" / "checkpoint-1")
    assert len(resumed) == 2
    for a, b in zip(history[1:], resumed, strict=True):
        assert a["reward"] == b["reward"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    samples_a = [t for t in load_jsonl(tmp_path / "a" / "samples.jsonl") if t.metrics["step"] > 1]
    samples_b = load_jsonl(tmp_path / "b" / "samples.jsonl")
    assert [t.completion_ids for t in samples_a] == [t.completion_ids for t in samples_b]
    for p, q in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_warmup_fits_demonstrations_and_training_logs_everything(tokenizer, tmp_path):
    model = tiny_model(tokenizer, seed=1, hidden_size=64)
    trainer = GRPOTrainer(
        model,
        "Wordle-v0",
        rows(8),
        args=config(tmp_path, max_steps=2),
        tokenizer=tokenizer,
        eval_dataset=rows(4, seed=5),
    )
    losses = trainer.warmup(rows(8, seed=9), SFTConfig(learning_rate=1e-2, epochs=20))
    assert losses[-1] < losses[0] / 2  # the demonstrations' assistant tokens became likely
    figures = trainer.evaluate(samples_file="eval.jsonl")
    episodes = load_jsonl(tmp_path / "eval.jsonl")
    assert figures["episodes"] == len(episodes) == 4
    assert figures["reward"] == pytest.approx(sum(t.reward for t in episodes) / 4)
    history = trainer.train()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert {"reward", "success_rate", "loss", "statuses", "step_seconds"} <= set(history[0])
    # transformers samples from the policy itself: a sync hands over no bytes
    assert history[0]["weight_sync_bytes"] == 0 and history[0]["weight_sync_seconds"] >= 0
    assert {"env/valid_guesses", "env/consistent_guesses", "env/win"} <= set(history[0])
    assert set(figures["env"]) == set(episodes[0].env_metrics) >= {"greens_found", "win"}
    assert len(load_jsonl(tmp_path / "samples.jsonl")) == 2 * 2 * 3
    assert (tmp_path / "rewards.png").exists() and (tmp_path / "checkpoint-2").is_dir()


def test_engine_log_lines_go_to_the_run_folder_unless_verbose(tokenizer, tmp_path, capsys, caplog):
    import logging
    import warnings

    trainer = GRPOTrainer(
        tiny_model(tokenizer), "Wordle-v0", rows(2), args=config(tmp_path), tokenizer=tokenizer
    )
    logging.getLogger("vllm.v1.worker.cpu_worker").warning("torch.set_num_threads skipped")
    warnings.warn_explicit("reduce_op is deprecated", FutureWarning, "/x/vllm/dispatch.py", 3)
    assert trainer.engine_log == (tmp_path / "engine.log").resolve()
    assert "set_num_threads" in trainer.engine_log.read_text()
    assert "FutureWarning: reduce_op is deprecated" in trainer.engine_log.read_text()
    assert "set_num_threads" not in capsys.readouterr().err
    verbose = GRPOTrainer(
        tiny_model(tokenizer),
        "Wordle-v0",
        rows(2),
        args=config(tmp_path / "verbose", verbose=True),
        tokenizer=tokenizer,
    )
    assert verbose.engine_log is None
    logging.getLogger("vllm.v1.worker.cpu_worker").warning("shown in the terminal")
    assert "shown in the terminal" in caplog.text  # propagated to the root logger again
    assert "shown in the terminal" not in trainer.engine_log.read_text()


def test_reward_functions_and_rloo(tokenizer, tmp_path):
    seen = {}

    def short_answers(prompts, completions, environments, trajectories, answer, **_):
        seen["columns"] = answer
        return [None if i == 0 else -len(c) / 100 for i, c in enumerate(completions)]

    model = train_tool_caller(tokenizer)
    args = config(tmp_path, max_steps=1, reward_weights=[1.0, 0.5], advantage="rloo")
    trainer = RLOOTrainer(
        model, "Wordle-v0", rows(4), reward_funcs=[short_answers], args=args, tokenizer=tokenizer
    )
    (metrics,) = trainer.train()
    assert len(seen["columns"]) == 6 and "rewards/short_answers" in metrics
    assert metrics["rewards/short_answers"] < 0
    episodes = load_jsonl(tmp_path / "samples.jsonl")  # the total beside its sources
    assert episodes[0].reward_sources["short_answers"] is None  # no opinion: left out
    for episode in episodes:
        env, short = episode.reward_sources["env"], episode.reward_sources["short_answers"]
        assert episode.reward == pytest.approx(env + 0.5 * (short or 0.0))


def test_crashing_environment_is_excluded_not_fatal(tokenizer, tmp_path):
    class Flaky(toolgym.Environment):
        calls = 0

        def reset(self, answer: str = "") -> str | None:
            Flaky.calls += 1
            if Flaky.calls % 3 == 0:
                raise RuntimeError("backend down")
            return None

        def guess(self, word: str) -> str:
            """Guess.

            Args:
                word: A word.
            """
            self.done, self.reward = True, float(word == "crane")
            return "ok"

    model = train_tool_caller(tokenizer)
    trainer = GRPOTrainer(
        model, Flaky, rows(4), args=config(tmp_path, max_steps=1), tokenizer=tokenizer
    )
    (metrics,) = trainer.train()
    assert metrics["excluded"] == 2 and metrics["statuses"]["env_error"] == 2


def test_lora_trains_only_the_adapters_and_saves_them(tokenizer, tmp_path):
    pytest.importorskip("peft")
    torch.manual_seed(0)
    model = train_tool_caller(tokenizer)
    base = {name: p.detach().clone() for name, p in model.named_parameters()}

    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    args = config(tmp_path, max_steps=2, lora=lora, temperature=1.0, learning_rate=1e-2)
    trainer = GRPOTrainer(
        model, "Wordle-v0", rows(4), reward_funcs=[length_mod_7], args=args, tokenizer=tokenizer
    )
    history = trainer.train()
    assert all(math.isfinite(m["loss"]) for m in history)
    trained = dict(trainer.learner.policy.named_parameters())
    adapters = {n: p for n, p in trained.items() if "lora_B" in n}
    assert adapters and any(p.abs().sum() > 0 for p in adapters.values())  # B starts at zero
    frozen = {
        n.removeprefix("base_model.model.").replace(".base_layer", ""): p
        for n, p in trained.items()
        if "lora_" not in n
    }
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[n].cpu(), base[n]) for n in base)  # the base model is frozen
    assert (tmp_path / "checkpoint-2" / "adapter_config.json").exists()


def test_metrics_history_restarts_with_a_fresh_run_and_resumes_without_repeats(tmp_path):
    from toolgym.algorithms.tracking import MetricsLog

    first = MetricsLog(tmp_path, [], {})
    for step in (1, 2, 3):
        first.log(step, {"reward": step / 10})
    first.log(3, {"eval/reward": 0.9})
    resumed = MetricsLog(tmp_path, [], {})  # from checkpoint-1: steps 2.. are replaced
    resumed.log(2, {"reward": 0.25})
    assert [(e["step"], e["reward"]) for e in resumed.history()] == [(1, 0.1), (2, 0.25)]
    fresh = MetricsLog(tmp_path, [], {})  # a new run in the same folder
    fresh.log(1, {"reward": 0.5})
    assert [(e["step"], e["reward"]) for e in fresh.history()] == [(1, 0.5)]


def test_bf16_runs_warmup_and_update_under_autocast_and_keeps_float32_weights(tokenizer, tmp_path):
    model = train_tool_caller(tokenizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    dtypes: list[set] = [set()]  # dtypes of a projection's outputs in passes with gradients

    def record(module, inputs, output):
        if torch.is_grad_enabled():
            dtypes[-1].add(output.dtype)

    model.model.layers[0].self_attn.q_proj.register_forward_hook(record)
    args = config(tmp_path, max_steps=1, bf16=True, env_reward=False)
    trainer = GRPOTrainer(
        model, "Wordle-v0", rows(4), reward_funcs=[valid_guesses], args=args, tokenizer=tokenizer
    )
    losses = trainer.warmup(rows(2, seed=9), SFTConfig(learning_rate=1e-3, bf16=True))
    assert dtypes == [{torch.bfloat16}] and all(map(math.isfinite, losses))
    dtypes.append(set())
    (metrics,) = trainer.train()
    assert dtypes[-1] == {torch.bfloat16}  # generation ran without gradients, in float32
    assert math.isfinite(metrics["loss"]) and abs(metrics["is_weight"] - 1) < 0.1
    trained = dict(trainer.learner.policy.named_parameters())
    assert all(p.dtype == torch.float32 for p in trained.values())
    assert any(not torch.equal(trained[n].cpu(), before[n]) for n in before)


def test_a_template_that_is_not_prefix_preserving_trains_one_sample_per_turn(tmp_path):
    """Hermes 3's real template rewrites the end of a tool turn once the next turn follows
    (`</tool_response><|im_end|>` becomes `</tool_response>\n<|im_end|>`): the trainer builds
    each episode one sample per turn, and the update trains on those samples."""
    from helpers import GUESS, ids
    from template_corpus import TEMPLATE_DIR, template_tokenizer

    from toolgym.agents import ScriptedEngine

    template = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
    tokenizer = template_tokenizer(TEMPLATE_DIR / "llama.cpp" / template)
    words = ["slate", "moist", "pound"]
    engine = ScriptedEngine([ids(tokenizer, GUESS.format(word=w)) for w in words])
    engine.update_weights = lambda model: None  # a script has no weights to receive
    model = tiny_model(tokenizer, seed=1)
    args = config(tmp_path, max_steps=1, parser="auto", env_reward=False)

    def by_position(prompts, completions, trajectories, **_):  # advantages that are not zero
        return [float(i) for i in range(len(trajectories))]

    trainer = GRPOTrainer(
        model, "Wordle-v0", rows(2), [by_position], args, tokenizer=tokenizer, engine=engine
    )
    assert trainer.agent.renderer.profile.per_turn
    before = [p.detach().clone() for p in model.parameters()]
    history = trainer.train()
    episodes = load_jsonl(tmp_path / "samples.jsonl")
    assert all(len(t.samples) == 3 and t.status == "max_turns" for t in episodes)
    for episode in episodes:
        for turn, following in zip(episode.samples, episode.samples[1:], strict=False):
            # the next prompt holds this turn's call and its result, re-rendered
            text = tokenizer.decode(following.prompt_ids)
            assert '{"name": "guess"' in text and "Guess 1/6" in text
            assert len(following.prompt_ids) > len(turn.prompt_ids)
            assert turn.loss_mask == [1] * len(turn.completion_ids)
    # env_reward=False: the total is the reward function's alone, and so are its sources
    positions = [float(i) for i in range(len(episodes))]
    assert [t.reward_sources for t in episodes] == [{"by_position": p} for p in positions]
    assert [t.reward for t in episodes] == positions
    assert math.isfinite(history[0]["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_environments_close_on_every_path(tokenizer, tmp_path):
    """A reward function that raises ends the step with its error, and every environment the
    step (or an evaluation) opened is closed: sandboxes and containers do not pile up."""
    from toolgym.builtin_envs.wordle import Wordle

    opened, closed = [], []

    class Counted(Wordle):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            opened.append(self)

        def close(self) -> None:
            closed.append(self)
            super().close()

    def broken(prompts, completions, trajectories, **_):
        raise RuntimeError("a reward function failed")

    model = tiny_model(tokenizer, seed=1)
    trainer = GRPOTrainer(
        model, Counted, rows(2), [broken], config(tmp_path, max_steps=1), tokenizer=tokenizer
    )
    with pytest.raises(RuntimeError, match="a reward function failed"):
        trainer.train()
    assert opened and len(closed) == len(opened)
    trainer.evaluate(rows(2, seed=3))
    assert len(closed) == len(opened) == 6 + 2


def test_several_passes_per_step_make_clipping_act_from_the_second(tokenizer, tmp_path):
    """`num_iterations=3`: the first pass's ratio is 1 (nothing clipped); later passes move
    the policy away from the logprobs taken before the first, and clipping acts."""
    torch.manual_seed(0)
    model = train_tool_caller(tokenizer)
    args = config(
        tmp_path,
        max_steps=1,
        num_iterations=3,
        learning_rate=3e-2,
        epsilon=0.01,
        epsilon_high=0.01,
        env_reward=False,
        temperature=0.8,
    )
    trainer = GRPOTrainer(
        model, "Wordle-v0", rows(6), reward_funcs=[length_mod_7], args=args, tokenizer=tokenizer
    )
    (metrics,) = trainer.train()
    assert metrics["reward_std"] > 0, "no advantage: nothing to update"
    assert metrics["clip_fraction/pass1"] == 0.0
    assert metrics["clip_fraction/pass2"] > 0.0
    assert metrics["clip_fraction/pass3"] > 0.0
    with pytest.raises(ValueError, match="num_iterations"):
        config(tmp_path, num_iterations=0)


def test_pipelining_needs_an_engine_with_its_own_weights(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="max_staleness"):
        GRPOTrainer(
            tiny_model(tokenizer),
            "Wordle-v0",
            rows(2),
            args=config(tmp_path, max_staleness=1),
            tokenizer=tokenizer,
        )


def test_warmup_cache_loads_the_same_weights_and_a_changed_setting_misses(tokenizer, tmp_path):
    def trainer(folder):
        model = tiny_model(tokenizer, seed=1, hidden_size=64)
        return GRPOTrainer(model, "Wordle-v0", rows(4), args=config(folder), tokenizer=tokenizer)

    demos, cache = rows(4, seed=9), tmp_path / "cache"
    first = trainer(tmp_path / "a")
    losses = first.warmup(demos, SFTConfig(batch_size=2), cache_dir=cache)
    assert first.warmup_cached_from is None and "warm-up" in first.stages.records
    second = trainer(tmp_path / "b")  # settings of memory, not of the result: loaded
    memory_only = SFTConfig(
        batch_size=2, micro_batch_size=1, logprob_chunk_size=8, share_prefix=False
    )
    assert second.warmup(demos, memory_only, cache_dir=cache) == losses
    assert second.warmup_cached_from is not None and "warm-up" not in second.stages.records
    first_state, second_state = first.model.state_dict(), second.model.state_dict()
    for p, q in zip(first_state.values(), second_state.values(), strict=True):
        assert torch.equal(p, q)
    third = trainer(tmp_path / "c")  # another learning rate: trained, not loaded
    third.warmup(demos, SFTConfig(batch_size=2, learning_rate=3e-4), cache_dir=cache)
    assert third.warmup_cached_from is None
    assert len(list((cache / "warmup").iterdir())) == 2


def test_time_budget_stops_before_a_step_that_would_not_fit(tokenizer, tmp_path):
    model = tiny_model(tokenizer, seed=1, hidden_size=64)
    trainer = GRPOTrainer(
        model, "Wordle-v0", rows(8), args=config(tmp_path, max_steps=8), tokenizer=tokenizer
    )
    step_seconds = statistics.fmean(m["step_seconds"] for m in trainer.train())
    assert trainer.stopped_by == "max_steps"
    budget = 2.5 * step_seconds
    trainer.args.max_seconds, trainer.args.max_steps = budget, 100
    history = trainer.train()
    assert 1 <= len(history) < 6 and trainer.stopped_by.startswith("max_seconds")
    spent = sum(m["step_seconds"] for m in history)
    assert spent <= budget + max(m["step_seconds"] for m in history)
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert stages["stages"]["rollouts"]["calls"] == 8 + len(history)
    assert stages["stages"]["update"]["peak_bytes"] > 0


def test_warmup_micro_batches_accumulate_to_the_same_step(tokenizer, tmp_path):
    from toolgym.algorithms import demonstrations, episode_factory, warmup_sft

    demos = demonstrations(episode_factory("Wordle-v0"), rows(6, seed=9), tokenizer)
    models = [tiny_model(tokenizer, seed=1, hidden_size=64) for _ in range(2)]
    runs = [
        warmup_sft(model, demos, 0, SFTConfig(batch_size=6, micro_batch_size=size, epochs=3))
        for model, size in zip(models, (6, 2), strict=True)
    ]
    assert runs[0] == pytest.approx(runs[1], rel=1e-4)
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5)


def test_warmup_computes_the_shared_prompt_once_with_the_same_result(tokenizer, monkeypatch):
    from toolgym.algorithms import demonstrations, episode_factory, losses, warmup_sft

    demos = demonstrations(episode_factory("Wordle-v0"), rows(6, seed=9), tokenizer)
    shared_passes = []
    plain_shared_forward = losses.shared_forward

    def counted(*args, **kwargs):
        shared_passes.append(args[-1])  # the prefix length
        return plain_shared_forward(*args, **kwargs)

    monkeypatch.setattr(losses, "shared_forward", counted)
    models = [tiny_model(tokenizer, seed=1, hidden_size=64) for _ in range(2)]
    runs = [
        warmup_sft(model, demos, 0, SFTConfig(batch_size=6, micro_batch_size=3, share_prefix=on))
        for model, on in zip(models, (True, False), strict=True)
    ]
    # after the one-time probe's, a shared pass per micro-batch of the first run only
    assert [length > 100 for length in shared_passes[-2:]] == [True, True]
    assert len(shared_passes) == 3
    assert runs[0] == pytest.approx(runs[1], rel=1e-4)
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5)


@pytest.mark.parametrize(
    "corrections, path",
    [
        (
            dict(
                loss_type="grpo",
                importance_sampling_level="sequence",
                importance_sampling_mode="sequence_mask",
                off_policy_mask_threshold=0.0,
            ),
            "chunked",
        ),
        (dict(loss_type="cispo", cispo_cap=1.05, importance_sampling_mode="token_mask"), "fused"),
    ],
    ids=["gspo, sequence mask, opsm", "cispo, token mask"],
)
def test_the_off_policy_corrections_train_and_log(
    tokenizer, tmp_path, monkeypatch, corrections, path
):
    """GSPO, OPSM, CISPO and the masked weights through the whole trainer (checked against
    their formulas and TRL in test_off_policy.py): the step runs on the path they need and
    logs the engine/trainer mismatch and what the corrections dropped."""
    from toolgym.algorithms import learner

    paths = []
    real = learner.learner_loss
    monkeypatch.setattr(
        learner, "learner_loss", lambda impl, *a: paths.append(impl) or real(impl, *a)
    )
    torch.manual_seed(0)
    args = config(
        tmp_path, max_steps=1, num_iterations=2, learning_rate=3e-2, env_reward=False, **corrections
    )
    trainer = GRPOTrainer(
        train_tool_caller(tokenizer), "Wordle-v0", rows(6), reward_funcs=[length_mod_7],
        args=args, tokenizer=tokenizer,
    )  # fmt: skip
    (metrics,) = trainer.train()
    assert set(paths) == {path}
    assert metrics["reward_std"] > 0 and math.isfinite(metrics["loss"])
    assert metrics["mismatch_kl"] >= 0 and metrics["mismatch_abs"] >= 0
    assert 0 <= metrics["is_masked"] <= 1
    if "off_policy_mask_threshold" in corrections:
        assert 0 <= metrics["off_policy_masked"] <= 1
    else:
        assert metrics["clip_fraction/pass2"] > 0  # CISPO's cap acts from the second pass


def test_turn_credit_and_dynamic_sampling_reach_the_update(tokenizer, tmp_path, monkeypatch):
    """`credit="turn"` and `dynamic_sampling` through the whole trainer: the update gets one
    advantage per sampled token (the values are checked by hand in test_turn_credit.py) and
    the step's batch as configured; the step logs dynamic sampling's figures."""
    from toolgym.algorithms import learner

    seen = []
    real = learner.Learner.update

    def spy(self, trajectories, advantages, used, everywhere, turn_credit=None):
        seen.append((trajectories, turn_credit))
        return real(self, trajectories, advantages, used, everywhere, turn_credit=turn_credit)

    monkeypatch.setattr(learner.Learner, "update", spy)
    torch.manual_seed(0)
    args = config(tmp_path, max_steps=1, credit="turn", env_reward=False, dynamic_sampling=True)
    trainer = GRPOTrainer(
        train_tool_caller(tokenizer), "Wordle-v0", rows(6), reward_funcs=[length_mod_7],
        args=args, tokenizer=tokenizer,
    )  # fmt: skip
    (metrics,) = trainer.train()
    ((trajectories, credit),) = seen
    assert credit is not None and len(credit) == len(trajectories) == 6
    assert math.isfinite(metrics["loss"]) and metrics["dynamic_rounds"] >= 0
    assert metrics["dynamic_groups_played"] >= args.prompts_per_step
    for trajectory, per_sample in zip(trajectories, credit, strict=True):
        for sample, values in zip(trajectory.samples, per_sample, strict=True):
            assert len(values) == len(sample.completion_ids)
