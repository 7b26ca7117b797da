"""A TRL script ports by changing its import (issue 42 item 5), checked against TRL 1.16 itself.

The same environment classes, reward functions and dataset go through TRL's `GRPOTrainer`
(installed into `.bench/site` by the set-up, as `bench/` uses it) and through
`toolgym.trl.GRPOTrainer`. The model is a script in both: a function of the prompt's text
(which row, which turn) that both trainers ask for each turn's tokens, so the episodes are the
same and every difference is the trainers'. Compared per episode: the prompt the model reads
(tool schemas, the row's prompt and the reset observation), every tool result it reads, and
the reward.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from pathlib import Path

import pytest

import toolgym.trl as toolgym_trl
from toolgym.testing import tiny_model, tiny_tokenizer

BENCH = Path(__file__).resolve().parents[2] / "bench"
GROUP = 2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trl():
    sys.path.insert(0, str(BENCH))
    try:
        from trl_peer import import_trl

        return import_trl()
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def tokenizer(trl):
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = qwen2_5_chat_template  # a template TRL parses tool calls for
    return tokenizer


# -- the environments and reward functions, written as TRL's docs write them -------------------
RESETS: list[list[str]] = []


class Counter:
    """A counter the model must bring to the row's target (the reward lives on the instance,
    read by a reward function: the shape whose reward was once counted twice)."""

    def reset(self, **kwargs):
        RESETS.append(sorted(kwargs))  # what reset is given: the row, as TRL gives it
        self.count = 0
        self.target = kwargs["target"]
        self.reward = 0.0
        return f"Count to {self.target}."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: How much to add (1 to 5).
        """
        if step > 5:
            raise ValueError("step must be at most 5")
        self.count += step
        self.reward = float(self.count == self.target)
        return self.count

    def peek(self) -> dict:
        """Show the counter and the target."""
        return {"count": self.count, "target": self.target}


def reward_func(environments, **kwargs):
    return [env.reward for env in environments]


class Vault:
    """An environment that owns its reward (`get_reward`), with an async tool."""

    def reset(self, code: int, **kwargs) -> str:
        self.code, self.opened = code, False
        return "A vault with a four-digit code."

    async def try_code(self, code: int) -> str:
        """Try a code on the vault.

        Args:
            code: Four digits.
        """
        self.opened = code == self.code
        return "open" if self.opened else "locked"

    def get_reward(self) -> float:
        return 1.0 if self.opened else 0.0


def brevity(completions, **kwargs):
    """A format reward: shorter final answers score more; None for episodes without one."""
    last = [c[-1] for c in completions]
    return [None if m.get("tool_calls") else 1.0 / (1 + len(m["content"])) for m in last]


async def knows_the_code(completions, code, trainer_state, **kwargs):
    """Reads a dataset column, the trainer's state and the tool results."""
    assert trainer_state.global_step == 0
    results = [[m["content"] for m in c if m["role"] == "tool"] for c in completions]
    return [
        float(bool(r) and r[-1] == "open") * 0.5 + c / 10_000
        for r, c in zip(results, code, strict=True)
    ]


CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'
SCRIPTS = {  # two ways to play each row, so that a group's episodes and rewards differ
    "Count to 3.": (
        [
            CALL.format(name="increment", arguments='{"step": 1}'),
            CALL.format(name="peek", arguments="{}"),
            CALL.format(name="increment", arguments='{"step": 2}'),
            "Done.<|im_end|>",
        ],
        [CALL.format(name="increment", arguments='{"step": 2}'), "Done.<|im_end|>"],
    ),
    "Count to 4.": (
        [
            CALL.format(name="increment", arguments='{"step": 9}'),  # the tool raises
            CALL.format(name="increment", arguments='{"step": "2"}'),  # a string for an int
            "I give up.<|im_end|>",
        ],
        [CALL.format(name="increment", arguments='{"step": 4}'), "Four.<|im_end|>"],
    ),
    "A vault with a four-digit code.": (
        [
            CALL.format(name="try_code", arguments='{"code": 1234}'),
            CALL.format(name="try_code", arguments='{"code": 4321}'),
            "It is open now.<|im_end|>",
        ],
        [CALL.format(name="try_code", arguments='{"code": 1111}'), "Locked.<|im_end|>"],
    ),
}


class Script:
    """The scripted model: the next turn of the row whose observation the prompt holds. A
    group's first requests (the same prompt) get the row's first way of playing, then its
    second, in turn; later turns continue the way their first turn chose."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.asked = tokenizer, {}

    def __call__(self, text: str) -> list[int]:
        row = next(key for key in SCRIPTS if key in text)
        turn = text.count("<|im_start|>assistant") - 1
        ways = SCRIPTS[row]
        if turn == 0:
            way = self.asked.get(text, 0) % len(ways)
            self.asked[text] = self.asked.get(text, 0) + 1
        else:
            way = next(i for i, w in enumerate(ways) if w[0].removesuffix("<|im_end|>") in text)
        return self.tokenizer.encode(ways[way][turn], add_special_tokens=False)


def by_member(episodes: list, key) -> list:
    """Each group's members in a fixed order (by `key`): the two trainers may play a group's
    two ways of playing in either order."""
    ordered = []
    for start in range(0, len(episodes), GROUP):
        ordered.extend(sorted(episodes[start : start + GROUP], key=key))
    return ordered


def recording(func, seen: list):
    """`func` as a reward function that first records what it is given (prompts,
    completions): both trainers call it by keywords, so the wrapper sees what `func` sees."""
    if inspect.iscoroutinefunction(func):

        async def wrapper(**kwargs):
            seen.append((kwargs["prompts"], kwargs["completions"]))
            return await func(**kwargs)

    else:

        def wrapper(**kwargs):
            seen.append((kwargs["prompts"], kwargs["completions"]))
            return func(**kwargs)

    wrapper.__name__ = func.__name__
    return wrapper


def trl_batch(trl, tokenizer, rows, env, reward_funcs, output_dir, **settings):
    """One batch through TRL's GRPOTrainer: per episode, the first prompt, the completion
    messages, the reward (its sources' weighted sum as TRL takes it, NaN where none scored)
    and the advantage; and what the reward functions were given."""
    from datasets import Dataset

    config = trl.GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to=[], **settings
    )
    given: list = []
    trainer = trl.GRPOTrainer(
        model=tiny_model(tokenizer),
        processing_class=tokenizer,
        args=config,
        train_dataset=Dataset.from_list(rows),
        reward_funcs=[recording(f, given) for f in reward_funcs],
        environment_factory=env,
    )
    prompts: list[str] = []
    play = Script(tokenizer)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = [tokenizer.decode(ids) for ids in prompt_ids]
        prompts.extend(t for t in texts if t.count("<|im_start|>assistant") == 1)
        return [play(text) for text in texts], None

    trainer._generate_single_turn = generate
    seen: dict = {}
    calculate = trainer._calculate_rewards

    def calculate_rewards(inputs, prompts_, completions, completion_ids):
        per_function = calculate(inputs, prompts_, completions, completion_ids)
        seen.update(per_function=per_function.cpu(), completions=completions)
        return per_function

    trainer._calculate_rewards = calculate_rewards
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(GROUP)])
    weights = trainer.reward_weights.cpu()
    rewards = [
        float((row * weights).nansum()) if not row.isnan().all() else math.nan
        for row in seen["per_function"]
    ]
    advantages = batch["advantages"].cpu().tolist()
    return prompts, seen["completions"], rewards, advantages, given


def toolgym_batch(monkeypatch, tokenizer, rows, env, reward_funcs, output_dir, **settings):
    """The same batch through `toolgym.trl.GRPOTrainer` with the same script."""
    import toolgym.algorithms.grpo as grpo
    from toolgym.agents import ScriptedEngine
    from toolgym.algorithms.advantages import group_advantages, trainable
    from toolgym.envs.calls import close_all

    play = Script(tokenizer)
    engine = ScriptedEngine(lambda ids: play(tokenizer.decode(ids)))
    engine.update_weights = lambda *args, **kwargs: None
    monkeypatch.setattr(grpo, "make_engine", lambda *args, **kwargs: engine)
    config = toolgym_trl.GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to=[], **settings
    )
    given: list = []
    trainer = toolgym_trl.GRPOTrainer(
        model=tiny_model(tokenizer),
        processing_class=tokenizer,
        args=config,
        train_dataset=rows,
        reward_funcs=[recording(f, given) for f in reward_funcs],
        environment_factory=env,
    )
    sampler = trainer.sampler
    batch = [dict(r) for r in rows for _ in range(GROUP)]
    envs = [sampler.make_env(row, 0) for row in batch]
    try:
        played = sampler.agent.run(envs, batch, [0] * len(batch), rollout_fn=sampler.rollout_fn)
        sampler._score(played, batch, envs, sampler.trainer_state(0))
    finally:
        close_all(envs)
    prompts = [tokenizer.decode(t.samples[0].prompt_ids) for t in played]
    completions = [[m for m in t.messages if m["role"] in ("assistant", "tool")] for t in played]
    rewards = [math.nan if t.reward is None else t.reward for t in played]
    advantages, _ = group_advantages(
        [t.reward or 0.0 for t in played], [trainable(t) for t in played], GROUP
    )
    return prompts, completions, rewards, advantages.tolist(), given


def _read(messages):
    """What the model reads of a completion: each message's role, text and calls."""
    return [
        (m["role"], m.get("content"), [c["function"] for c in m.get("tool_calls") or []])
        for m in messages
    ]


def scores_the_short_count_only(environments, **kwargs):
    """No opinion on episodes that stopped at 2: TRL leaves them out of their group, so the
    member scored beside one is not ranked against it (toolgym once counted it 0)."""
    return [None if env.count == 2 else env.reward for env in environments]


CASES = {
    "a class with a reward attribute, read by a reward function": (
        Counter,
        [{"prompt": [{"role": "user", "content": "Play. "}], "target": t} for t in (3, 4)],
        [reward_func],
        {},
    ),
    "get_reward, weighted and async reward functions, None, columns": (
        Vault,
        [{"prompt": [{"role": "user", "content": "Open it. "}], "code": c} for c in (1234, 4321)],
        [brevity, knows_the_code],
        {"reward_weights": [0.5, 2.0]},
    ),
    "episodes no source scores": (
        Counter,
        [{"prompt": [{"role": "user", "content": "Play. "}], "target": t} for t in (3, 4)],
        [scores_the_short_count_only],
        {},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trl_and_toolgym_give_the_same_episodes_and_rewards(
    case, trl, tokenizer, monkeypatch, tmp_path
):
    env, rows, funcs, extra = CASES[case]
    settings = {
        "per_device_train_batch_size": len(rows) * GROUP,
        "num_generations": GROUP,
        "max_completion_length": 512,
        "max_tool_calling_iterations": 5,
        **extra,
    }
    RESETS.clear()
    theirs = trl_batch(trl, tokenizer, rows, env, list(funcs), tmp_path / "trl", **settings)
    their_resets = sorted(RESETS)
    RESETS.clear()
    ours = toolgym_batch(
        monkeypatch, tokenizer, rows, env, list(funcs), tmp_path / "tg", **settings
    )
    assert sorted(RESETS) == their_resets  # reset(**row): the prompt and columns, no seed
    assert sorted(ours[0]) == sorted(theirs[0])  # prompts: schemas, the row, the observation
    mine, their = (by_member(list(zip(*b[1:4], strict=True)), _key) for b in (ours, theirs))
    assert [_read(c) for c, _, _ in mine] == [_read(c) for c, _, _ in their]  # tool results
    assert [r for _, r, _ in mine] == pytest.approx([r for _, r, _ in their], nan_ok=True)
    assert [a for _, _, a in mine] == pytest.approx([a for _, _, a in their], abs=1e-4)
    assert any(abs(a) > 0.1 for _, _, a in mine) or case == "episodes no source scores"
    assert _given(ours[4]) == _given(theirs[4])  # what the reward functions were given


def _key(episode) -> str:
    return repr(_read(episode[0]))


def _given(given) -> list:
    """What reward functions read of the prompts and completions, in member order."""
    calls = []
    for prompts, completions in given:
        pairs = [(_read(p), _read(c)) for p, c in zip(prompts, completions, strict=True)]
        calls.append(by_member(pairs, lambda pair: repr(pair[1])))
    return calls


def test_the_config_keeps_trls_defaults(trl):
    """Every field toolgym.trl maps or accepts has TRL 1.16's own default."""
    theirs = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    accepted = {**toolgym_trl.MAPPED, **toolgym_trl.WITHOUT_EQUIVALENT}
    missing = [name for name in accepted if name not in theirs]
    assert not missing, f"not fields of TRL's GRPOConfig: {missing}"
    differ = {k: (v, theirs[k]) for k, v in accepted.items() if theirs[k] != v}
    assert not differ, differ


def test_trls_names_map_and_the_rest_is_refused_naming_the_field():
    config = toolgym_trl.GRPOConfig(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=300,
        max_tool_calling_iterations=3,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url="http://127.0.0.1:8011",
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # a fraction: a ratio of the steps
        num_train_epochs=2,
        top_k=0,  # TRL's default: accepted, changes nothing
        use_cpu=True,
    ).to_toolgym(dataset_size=10)
    assert (config.prompts_per_step, config.num_generations, config.micro_batch_size) == (2, 4, 4)
    assert config.max_steps == 10 and config.warmup_steps == 1  # 2 epochs of 10 rows, 2 a step
    assert config.limits.max_turns == 4 and config.limits.max_episode_tokens == 300
    assert (config.engine, config.vllm_server_url) == ("vllm-server", "http://127.0.0.1:8011")
    assert config.gradient_checkpointing and config.bf16 and config.logging_steps == 10
    # TRL's corrections by default: a sequence mask at 3.0 on what vLLM sampled, KL corrected
    assert config.importance_sampling and config.importance_sampling_mode == "sequence_mask"
    assert (config.importance_sampling_cap, config.importance_sampling_min) == (3.0, None)
    assert config.kl_bias_correction and config.loss_settings().whole_sequences
    assert not toolgym_trl.GRPOConfig().to_toolgym(8).importance_sampling  # TRL: vLLM only
    cispo = toolgym_trl.GRPOConfig(loss_type="cispo", epsilon_high=5.0).to_toolgym(8)
    assert (cispo.loss_type, cispo.cispo_cap) == ("cispo", 5.0)
    with pytest.raises(TypeError, match=r"TRL's top_k=5 has no toolgym equivalent"):
        toolgym_trl.GRPOConfig(top_k=5)
    with pytest.raises(TypeError, match=r"'per_device_batch' is neither a TRL 1.16 field"):
        toolgym_trl.GRPOConfig(per_device_batch=4)
    with pytest.raises(ValueError, match="divisible by num_generations"):
        toolgym_trl.GRPOConfig(per_device_train_batch_size=6, num_generations=4).to_toolgym(8)
    with pytest.raises(TypeError, match="callbacks has no toolgym equivalent"):
        toolgym_trl.GRPOTrainer("smollm2-135m", train_dataset=[{}], callbacks=[object()])


def test_a_peft_config_as_trl_scripts_write_it_becomes_toolgyms_lora(tmp_path):
    """TRL's examples pass `LoraConfig(task_type="CAUSAL_LM", ...)`; toolgym sets the task
    itself, and the trainer builds its adapters from the rest."""
    from peft import LoraConfig

    tokenizer = tiny_tokenizer()
    trainer = toolgym_trl.GRPOTrainer(
        model=tiny_model(tokenizer),
        reward_funcs=reward_func,
        args=toolgym_trl.GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2
        ),
        train_dataset=[{"prompt": "Count.", "target": 3}] * 2,
        processing_class=tokenizer,
        environment_factory=Counter,
        peft_config=LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=16),
    )
    assert trainer.args.lora == {"r": 4, "lora_alpha": 16}
    trainable = [n for n, p in trainer.learner.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_rewards_never_count_twice_with_toolgym_classes_either():
    """The rule for a `toolgym.Environment` (docs/trl.md): its own reward is one source and a
    reward function another, summed with `reward_weights`; `env_reward=False` leaves it out."""
    import toolgym
    from toolgym.agents import Trajectory
    from toolgym.algorithms.rewards import compute_rewards, reward_owner

    plain, ours = toolgym.as_environment(Counter()), toolgym.make("GuessNumber-v0")
    plain.reset(target=3)
    assert reward_owner(plain) == "attribute" and reward_owner(ours) == "environment"
    assert reward_owner(toolgym.as_environment(Vault())) == "get_reward"
    played = Trajectory()
    played.reward = 1.0
    rows = [{"prompt": "p", "target": 3}]
    assert compute_rewards([played], rows, [plain], [reward_func])[0] == [0.0]  # the function's
    assert compute_rewards([played], rows, [plain], [])[0] == [1.0]  # the attribute, alone
    with_env = compute_rewards([played], rows, [ours], [lambda **k: [0.25]], [1.0, 2.0])
    assert with_env[0] == [1.5]
    assert compute_rewards([played], rows, [ours], [lambda **k: [0.25]], env_reward=False)[0] == [
        0.25
    ]
