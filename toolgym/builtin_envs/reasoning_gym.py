"""reasoning-gym's tasks as final-answer environments, scored by reasoning-gym's own scorers.

[reasoning-gym](https://pypi.org/project/reasoning-gym/) (`pip install 'toolgym[reasoning-gym]'`)
generates procedural reasoning tasks: `reasoning_gym.create_dataset(name, seed=, size=)` gives
entries (`question`, `answer`, `metadata`) and `dataset.score_answer(answer, entry)` grades one.
Every task is registered as `reasoning-gym/<task>` (no version suffix: the id is the package's
own task name) the first time such an id is asked for or ids are listed, so `import toolgym`
does not import reasoning_gym:

    env = toolgym.make("reasoning-gym/basic_arithmetic")
    rows = toolgym.spec("reasoning-gym/basic_arithmetic").dataset(8, seed=0, split="test")

The episode: `reset(**row)` regenerates the row's entry (rows carry its task, dataset seed,
size and index, not the entry, so the scorer sees exactly what reasoning-gym made); the model
answers without tools; `final_answer(text)` takes the answer from the text (the last
`<answer>...</answer>`, as reasoning-gym's own prompts ask, else the whole text stripped of
`<think>` blocks) and sets `reward` to the task's score (0 to 1) and `done`.

Splits are disjoint seed ranges: row i of `dataset(n, seed, split="train")` is entry i of the
reasoning-gym dataset with seed `seed`, and of `split="test"` the one with seed `2**31 + seed`.
Nearly every task draws entry i from `Random(dataset_seed + i)`, so the two splits never share
a generator seed; a task with few possible questions (a small `gcd`, `coin_flip`) can still
ask the same question in both.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from toolgym.envs.core import Environment

SPLIT_SEEDS = 2**31
"""Seeds of one split: train uses [0, 2**31), test [2**31, 2**32) (reasoning-gym's seeds are
32-bit)."""
EXCLUDED_TASKS = frozenset({"composite", "game_of_life_halting"})
"""Not registered: `composite` is not one task (it mixes datasets named in its
configuration); `game_of_life_halting`'s scorer (reasoning-gym 0.1.25) pays 1.0 for any
non-empty answer (`bool("False")` is True), a reward a policy would learn to farm."""
INSTRUCTION = "Give only the final answer between <answer> and </answer> tags."
"""Appended to the question when `reset` draws its own problem (no row, no system prompt)."""
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_LINK = re.compile(r"\[([^]]*)\]\([^)]*\)")  # a Markdown link in a task's docstring


class ReasoningGymTask(Environment):
    """One reasoning-gym task, graded on the final answer by the task's own scorer.

    No tools: the model's first answer ends the episode (a turn that calls a tool is an
    unknown tool, and the turn limit ends the episode without a reward).

    Args:
        task: reasoning-gym's task name (`reasoning_gym.factory.DATASETS`), the default of
            rows that do not name one.
        require_tags: Grade only an answer inside `<answer>` tags (a text without them scores
            0); by default such a text is graded whole.
        max_turns: Assistant turns before truncation.
    """

    def __init__(
        self, task: str = "basic_arithmetic", require_tags: bool = False, max_turns: int = 1
    ) -> None:
        self.task = task
        self.require_tags = require_tags
        self.max_turns = max_turns
        self.entry: dict[str, Any] | None = None
        self.answer: str | None = None
        self.tagged = False
        self._dataset: Any = None

    def reset(
        self,
        task: str | None = None,
        dataset_seed: int | None = None,
        dataset_size: int = 1,
        index: int = 0,
        task_config: str | dict[str, Any] | None = None,
    ) -> str | None:
        """Regenerate a row's entry; without `dataset_seed`, draw a training-split problem
        from the episode's seed and return its question (a row's prompt already holds it)."""
        drew = dataset_seed is None
        if dataset_seed is None:
            dataset_seed, dataset_size, index = self.rng.randrange(SPLIT_SEEDS - 1), 1, 0
        config = json.loads(task_config) if isinstance(task_config, str) else task_config or {}
        self._dataset = dataset(task or self.task, dataset_seed, dataset_size, _key(config))
        self.entry = self._dataset[index]
        self.answer, self.tagged = None, False
        return f"{self.entry['question']}\n\n{INSTRUCTION}" if drew else None

    def final_answer(self, text: str) -> None:
        if self.entry is None:
            raise RuntimeError("final_answer before reset: there is no question to grade")
        self.answer, self.tagged = extract_answer(text, self.require_tags)
        try:
            score = float(self._dataset.score_answer(self.answer, entry=self.entry))
        except Exception:  # a scorer that cannot read the answer (prime_factorization: "x")
            score = 0.0
        self.reward = score
        self.done = True

    def episode_metrics(self) -> dict[str, float]:
        """`answer_tagged`: 1 when the final answer was inside `<answer>` tags."""
        return {"answer_tagged": float(self.tagged)}


def extract_answer(text: str, require_tags: bool = False) -> tuple[str | None, bool]:
    """The answer in a final message and whether it was tagged: the last `<answer>...</answer>`
    (reasoning-gym's own `extract_answer`), else the text without `<think>` blocks, stripped
    (None with `require_tags`)."""
    from reasoning_gym.utils import extract_answer as tagged_answer

    found = tagged_answer(text)
    if found is not None:
        return found, True
    return (None if require_tags else _THINK.sub("", text).strip()), False


@functools.lru_cache(maxsize=64)
def dataset(task: str, seed: int, size: int, config_key: str = "{}") -> Any:
    """reasoning-gym's dataset (cached: some tasks read data files when made)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(task, seed=seed, size=size, **json.loads(config_key))


def split_seed(seed: int, n: int, split: str) -> int:
    """The reasoning-gym dataset seed of `n` rows of `split` ("train" or "test") from `seed`."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    if seed < 0 or seed + n > SPLIT_SEEDS:
        raise ValueError(f"need 0 <= seed and seed + n <= 2**31, got seed={seed}, n={n}")
    return seed + (SPLIT_SEEDS if split == "test" else 0)


def reasoning_gym_dataset(
    n: int,
    seed: int = 0,
    task: str = "basic_arithmetic",
    split: str = "train",
    system_prompt: str | None = "default",
    **config: Any,
) -> list[dict[str, Any]]:
    """`n` rows of a task: `prompt` (a system prompt and the question), and what `reset`
    regenerates the entry from (`task`, `dataset_seed`, `dataset_size`, `index`,
    `task_config`).

    Args:
        n: Rows.
        seed: The split's seed (see the module's docstring).
        task: reasoning-gym's task name.
        split: "train" or "test" (held out: disjoint dataset seeds).
        system_prompt: A key of `reasoning_gym.utils.SYSTEM_PROMPTS` ("default" asks for
            `<answer>` tags), any other text as it is, or None for none.
        **config: The task's configuration (its config dataclass's fields, e.g. `min_terms`).
    """
    from reasoning_gym.utils import SYSTEM_PROMPTS

    dataset_seed = split_seed(seed, n, split)
    key = _key(config)
    source = dataset(task, dataset_seed, n, key)
    system = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
    rows = []
    for index in range(n):
        user = {"role": "user", "content": source[index]["question"]}
        prompt = [{"role": "system", "content": system}, user] if system else [user]
        row = {"task": task, "dataset_seed": dataset_seed, "dataset_size": n, "index": index}
        rows.append({"prompt": prompt, **row, "task_config": key})
    return rows


def task_names() -> list[str]:
    """reasoning-gym's task names that are registered (all but `EXCLUDED_TASKS`)."""
    from reasoning_gym.factory import DATASETS

    return sorted(set(DATASETS) - EXCLUDED_TASKS)


def register_tasks(register: Callable[..., Any]) -> None:
    """Register `reasoning-gym/<task>` for every task with `register` (the registry's; it calls
    this while no such id is registered, when one is asked for or ids are listed).
    ImportError, naming the extra, when reasoning-gym is not installed."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as error:
        raise ImportError(
            "the reasoning-gym/ environments need the reasoning-gym package: "
            "pip install 'toolgym[reasoning-gym]'"
        ) from error
    for name in task_names():
        doc = (DATASETS[name][0].__doc__ or "").strip().splitlines() or ["(no description)"]
        register(
            f"reasoning-gym/{name}",
            ReasoningGymTask,
            dataset=functools.partial(reasoning_gym_dataset, task=name),
            description="reasoning-gym: " + _LINK.sub(r"\1", doc[0]),
            task=name,
        )


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)
