"""Classes written for TRL's `environment_factory` (and `Environment` subclasses) run as TRL
runs them: the shapes of TRL's own tests, docs, examples and experimental adapters (issue 25
item 3, and the seed defect)."""

from __future__ import annotations

import math
import random
import warnings
from concurrent.futures import ThreadPoolExecutor
from random import randint

import pytest

import toolgym
from toolgym.envs.seeding import UnseededRandomWarning


# -- the seed: a `super().reset(...)` chain keeps it --------------------------------------------
class Board(toolgym.Environment):
    def reset(self, target: int = 0) -> str:
        self.target = target
        self.start = self.rng.randint(0, 10**9)
        return f"start {self.start}"

    def move(self) -> str:
        """Move once."""
        return str(self.rng.randint(0, 10**9))


class HardBoard(Board):
    def reset(self, level: int = 1) -> str:
        return super().reset(target=level * 10)


class HarderBoard(HardBoard):
    def reset(self, **row) -> str:
        observation = super().reset(level=3)
        self.extra = self.rng.random()
        return observation


def test_a_super_reset_chain_keeps_the_seed():
    for cls in (HardBoard, HarderBoard):
        first, second = (toolgym.as_environment(cls()) for _ in range(2))
        assert first.reset(seed=0) == second.reset(seed=0)
        assert (
            first.unwrapped.target == second.unwrapped.target == (30 if cls is HarderBoard else 10)
        )
        assert (
            first.step(toolgym.ToolCall("move")).messages
            == second.step(toolgym.ToolCall("move")).messages
        )
        assert first.reset(seed=1) != first.reset(seed=2)  # the seed still reaches it
        assert toolgym.as_environment(cls()).reset(seed=5) == toolgym.as_environment(cls()).reset(
            seed=5
        )


def test_a_seed_passed_to_super_reset_reseeds():
    class Fixed(toolgym.Environment):
        def reset(self) -> str:
            super().reset(seed=7)
            return str(self.rng.random())

    fixed = [toolgym.as_environment(Fixed()).reset(seed=seed) for seed in (0, 1)]
    assert fixed[0] == fixed[1] == str(random.Random(7).random())


# -- (a) the reward is read once, when the episode ends ----------------------------------------
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'
_NO_REWARD = object()


class LazyVerifier:
    """TRL's Harbor-adapter shape: `reward` is a property computed on first access (a verifier
    run once) and cached until the next `reset`."""

    def __init__(self):
        self.verifications = 0

    def reset(self, **kwargs) -> str:
        self.answer = ""
        self._reward = _NO_REWARD
        return "Write the answer to the file."

    def write_answer(self, text: str) -> str:
        """Write the answer file.

        Args:
            text: The answer.
        """
        self.answer = text
        return "written"

    @property
    def reward(self) -> float:
        if self._reward is _NO_REWARD:
            self.verifications += 1
            self._reward = float(self.answer == "42")
        return self._reward


def test_a_lazy_reward_is_read_once_when_the_episode_ends():
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    replies = [CALL.format(name="write_answer", arguments='{"text": "42"}'), "Done.<|im_end|>"]
    instance = LazyVerifier()
    agent = scripted_agent(tiny_tokenizer(), replies)
    (trajectory,) = agent.run([instance], [{"prompt": "Solve."}])
    assert trajectory.status == "finished"
    assert trajectory.reward == 1.0  # before: 0.0, the property frozen before the call
    assert instance.verifications == 1


def test_a_plain_class_steps_without_reading_its_reward():
    instance = LazyVerifier()
    env = toolgym.as_environment(instance)
    assert not env.reward_per_step
    env.reset()
    step = env.step(toolgym.ToolCall("write_answer", {"text": "42"}))
    assert step.reward == 0.0 and instance.verifications == 0
    env.final_answer("Done.")
    assert env.get_reward() == env.reward == 1.0 and instance.verifications == 1


def test_the_step_that_ends_a_plain_episode_carries_its_reward_read_once():
    class Lock:
        def __init__(self):
            self.reads = 0

        def reset(self, **kwargs):
            self.done, self.opened = False, False

        def open(self, code: int) -> str:
            """Try a code; the episode ends either way.

            Args:
                code: The code.
            """
            self.opened, self.done = code == 7, True
            return "click"

        def get_reward(self) -> float:
            self.reads += 1
            return float(self.opened)

    instance = Lock()
    env = toolgym.as_environment(instance)
    env.reset()
    step = env.step(toolgym.ToolCall("open", {"code": 7}))
    assert step.terminated and step.reward == 1.0
    assert env.get_reward() == 1.0 and instance.reads == 1  # the agent's read: the same value
    assert env.step(toolgym.ToolCall("open", {"code": 7})).reward == 0.0  # after the end
    env.reset()
    assert env.get_reward() == 0.0 and instance.reads == 2  # a new episode reads again


def test_environment_subclasses_keep_per_step_changes_and_may_opt_out():
    class Counter(toolgym.Environment):
        def reset(self) -> None:
            self.reads = 0

        def add(self) -> str:
            """Add one."""
            self.reward += 1
            return "ok"

    env = toolgym.as_environment(Counter())
    env.reset(seed=0)
    assert env.reward_per_step and env.step(toolgym.ToolCall("add")).reward == 1.0

    class Verified(Counter):
        reward_per_step = False

    env = toolgym.as_environment(Verified())
    env.reset(seed=0)
    assert env.step(toolgym.ToolCall("add")).reward == 0.0 and env.get_reward() == 1.0
    assert "reward_per_step" not in {t["function"]["name"] for t in env.tools}


# -- (d) a reward of None is "no reward" -------------------------------------------------------
class OpenEnvShaped:
    """OpenEnv's default: `reward` is None until something scores the episode."""

    def reset(self, **kwargs) -> str:
        self.reward = None
        self.done = False
        return "Echo something."

    def echo(self, message: str) -> str:
        """Echo a message.

        Args:
            message: What to echo.
        """
        return message


def test_a_none_reward_is_no_reward_not_a_type_error():
    env = toolgym.as_environment(OpenEnvShaped())
    env.reset()
    step = env.step(toolgym.ToolCall("echo", {"message": "hi"}))  # before: TypeError here
    assert step.messages[0]["content"] == "hi" and step.reward == 0.0
    assert env.get_reward() is None and env.reward is None

    class PerStep(toolgym.Environment):
        def reset(self) -> None:
            self.reward = None

        def echo(self, message: str) -> str:
            """Echo a message.

            Args:
                message: What to echo.
            """
            return message

    env = toolgym.as_environment(PerStep())
    env.reset(seed=0)
    assert env.step(toolgym.ToolCall("echo", {"message": "hi"})).reward == 0.0
    assert env.get_reward() is None


def test_a_none_reward_leaves_the_sum_to_the_sources_that_score():
    from toolgym.agents import Trajectory
    from toolgym.algorithms.rewards import compute_rewards

    unscored, scored = Trajectory(), Trajectory()
    unscored.reward, scored.reward = None, 0.5  # the environment's reward: None is no reward

    def length_bonus(prompts, completions, **kwargs):
        return [0.25, None]

    totals, sources = compute_rewards(
        [unscored, scored], [{"prompt": "a"}, {"prompt": "b"}], [None, None], [length_bonus]
    )
    assert totals == [0.25, 0.5]  # each scored by the sources that gave a value, as in TRL
    assert math.isnan(sources["env"][0])


def test_a_none_reward_episode_is_not_an_environment_error():
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    replies = [CALL.format(name="echo", arguments='{"message": "hi"}'), "Done.<|im_end|>"]
    agent = scripted_agent(tiny_tokenizer(), replies)
    (trajectory,) = agent.run([OpenEnvShaped()], [{"prompt": "Go."}])
    assert trajectory.status == "finished" and trajectory.reward is None
    from toolgym.agents import summarize
    from toolgym.cli.show import status_line

    assert summarize([trajectory])["reward"] == 0.0  # counted 0, as TRL sums what scores
    assert "reward none" in status_line(trajectory).plain


# -- (b) protocol names on a plain class: exposed as TRL does, or refused naming the clash ------
class Closer:
    def reset(self, **kwargs):
        return None

    def close(self) -> str:
        """Close the ticket."""
        return "closed"


def test_a_plain_method_named_like_a_hook_is_refused_naming_the_clash():
    with pytest.raises(toolgym.ProtocolClashError, match=r"Closer\.close .*TRL.*release"):
        toolgym.as_environment(Closer())
    with pytest.raises(toolgym.ProtocolClashError, match=r"Closer\.close"):
        toolgym.register("test/Closer-v0", Closer)

    class Finisher:
        def reset(self, **kwargs):
            return None

        def done(self) -> str:
            """Say that you are done."""
            return "ok"

    with pytest.raises(toolgym.ProtocolClashError, match=r"Finisher\.done .*whether the episode"):
        toolgym.as_environment(Finisher())

    class Session:
        def close(self) -> str:
            """Close the session."""
            return "closed"

    class Bound:
        def __init__(self):
            self.close = Session().close  # bound in __init__: found, and refused the same

        def reset(self, **kwargs):
            return None

    with pytest.raises(toolgym.ProtocolClashError, match=r"Bound\.close"):
        toolgym.as_environment(Bound())


def test_a_plain_method_named_like_a_stepper_name_is_a_tool_as_in_trl():
    class Machine:
        def reset(self, **kwargs):
            self.position = 0

        def step(self, n: int) -> str:
            """Step forward.

            Args:
                n: How far.
            """
            self.position += n
            return str(self.position)

        def tools(self) -> str:
            """List the machine's tools."""
            return "a wrench"

    env = toolgym.as_environment(Machine())
    assert [t["function"]["name"] for t in env.tools] == ["step", "tools"]
    env.reset()
    result = env.step([toolgym.ToolCall("step", {"n": 2}), toolgym.ToolCall("tools")])
    assert [m["content"] for m in result.messages] == ["2", "a wrench"]


def test_a_marked_hook_is_toolgyms_and_not_a_tool():
    class Marked:
        def __init__(self):
            self.closed = 0

        def reset(self, **kwargs):
            return None

        @toolgym.hook
        def close(self) -> None:
            self.closed += 1

        def ping(self) -> str:
            """Ping."""
            return "pong"

    instance = Marked()
    env = toolgym.as_environment(instance)
    assert [t["function"]["name"] for t in env.tools] == ["ping"]
    env.close()
    assert instance.closed == 1

    class Sub(toolgym.Environment):  # an Environment subclass's hooks need no mark
        def close(self) -> None:
            self.closed = True

    assert toolgym.as_environment(Sub()).tools == []


# -- (c) tools bound per instance are found ---------------------------------------------------
class Backend:
    def search(self, query: str) -> str:
        """Search the index.

        Args:
            query: What to look for.
        """
        return f"results for {query}"


class PerInstance:
    """Tools bound in `__init__`: `self.<tool> = <bound method>`."""

    def __init__(self):
        self.lookup = Backend().search

    def reset(self, **kwargs):
        return None


def _bind_on_class(cls, name):
    """What TRL's OpenReward adapter does in `__init__`: a tool method set on the class."""

    def tool(self, text: str) -> str:
        return text[::-1]

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = "Reverse the text.\n\nArgs:\n    text: The text."
    setattr(cls, name, tool)


class OpenRewardShaped:
    def __init__(self):
        _bind_on_class(type(self), "reverse")

    def reset(self, **kwargs):
        return "Use the server's tools."


@pytest.fixture
def registered_late_binders():
    from toolgym import registry

    ids = ["test/PerInstance-v0", "test/OpenRewardShaped-v0"]
    yield ids
    for env_id in ids:
        registry._registry.pop(env_id, None)
        try:
            import gymnasium

            gymnasium.registry.pop("toolgym/" + env_id.replace("/", "."), None)
        except ImportError:
            pass


def test_tools_bound_in_init_are_found_through_the_registry(registered_late_binders):
    toolgym.register(registered_late_binders[0], PerInstance)
    toolgym.register(registered_late_binders[1], OpenRewardShaped)  # no tools on the class yet
    env = toolgym.make(registered_late_binders[0])
    assert [t["function"]["name"] for t in env.tools] == ["lookup"]  # before: none
    env.reset()
    step = env.step(toolgym.ToolCall("lookup", {"query": "kiwi"}))
    assert step.messages[0]["content"] == "results for kiwi"
    env = toolgym.make(registered_late_binders[1])
    assert [t["function"]["name"] for t in env.tools] == ["reverse"]
    env.reset()
    assert env.step(toolgym.ToolCall("reverse", {"text": "abc"})).messages[0]["content"] == "cba"


def test_an_agent_sees_and_calls_a_tool_bound_in_init():
    from helpers import scripted_agent

    from toolgym.testing import tiny_tokenizer

    replies = [CALL.format(name="lookup", arguments='{"query": "kiwi"}'), "Found.<|im_end|>"]
    agent = scripted_agent(tiny_tokenizer(), replies)
    (trajectory,) = agent.run([PerInstance()], [{"prompt": "Look it up."}])
    assert trajectory.status == "finished"
    assert trajectory.messages[-2]["content"] == "results for kiwi"


# -- (e) the random module: a warning at first reset, and a way to opt in ----------------------
WORDS = ["apple", "berry", "cherry", "grape", "lemon", "mango", "peach", "plum"]


def _task_class(**attributes):
    """A plain class that draws its task from the `random` module (TRL examples do)."""

    def reset(self, **kwargs) -> str:
        self.word = random.choice(WORDS)
        self.number = randint(0, 10**9)
        return f"Guess the word ({len(self.word)} letters)."

    def guess(self, word: str) -> str:
        """Guess the word.

        Args:
            word: The guess.
        """
        return "right" if word == self.word else "wrong"

    return type("RandomTask", (), {"reset": reset, "guess": guess, **attributes})


def test_a_class_drawing_from_the_random_module_is_warned_at_first_reset():
    env = toolgym.as_environment(_task_class()())
    with pytest.warns(UnseededRandomWarning) as caught:
        env.reset(seed=0)
    (warning,) = caught
    message = str(warning.message)
    assert "RandomTask.reset: random.choice" in message
    assert "randint (from random)" in message and "seed_global_random = True" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset(seed=1)  # once per class

    class OwnGenerator:
        def reset(self, seed=None, **kwargs) -> str:
            self.rng = random.Random(seed)
            return random.Random(seed).choice(WORDS) + self.rng.choice(WORDS)

    class Drawer(toolgym.Environment):
        def reset(self) -> None:
            self.value = random.random()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        toolgym.as_environment(OwnGenerator()).reset(seed=0)
    with pytest.warns(UnseededRandomWarning, match=r"Drawer\.reset: random\.random"):
        toolgym.as_environment(Drawer()).reset(seed=0)


def test_opting_in_seeds_the_random_module_before_each_reset():
    cls = _task_class(seed_global_random=True)
    envs = [toolgym.as_environment(cls()) for _ in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an opted-in class is not warned about
        with ThreadPoolExecutor(8) as pool:  # resets run concurrently, as in the agent loop
            list(pool.map(lambda env: env.reset(seed=3), envs))
    states = {(env.executor.instance.word, env.executor.instance.number) for env in envs}
    assert len(states) == 1  # a group starts from one state
    envs[0].reset(seed=4)
    assert (envs[0].executor.instance.word, envs[0].executor.instance.number) not in states

    class Drawer(toolgym.Environment):
        seed_global_random = True

        def reset(self) -> None:
            self.value = random.random()

    first, second = toolgym.as_environment(Drawer()), toolgym.as_environment(Drawer())
    first.reset(seed=0)
    random.random()
    second.reset(seed=0)
    assert first.unwrapped.value == second.unwrapped.value


# -- the same contract in a sandbox ------------------------------------------------------------
@pytest.mark.skipif(
    __import__("os").environ.get("TOOLGYM_REQUIRE_SANDBOXES") != "1"
    and __import__("shutil").which("bwrap") is None,
    reason="bubblewrap is not installed",
)
def test_a_sandboxed_plain_class_keeps_the_reward_contract_and_names_init_tools():
    """In a process sandbox: a lazy reward is read once when asked (not frozen by the first
    reply), None stays "no reward", and tools bound in `__init__` (which the host cannot build
    schemas for) are refused at creation with their names."""
    from toolgym.sandbox import SandboxError, sandboxed

    lazy = sandboxed(LazyVerifier, {}, "process")
    try:
        lazy.reset()
        lazy.step(toolgym.ToolCall("write_answer", {"text": "42"}))
        assert lazy.get_reward() == 1.0  # before: 0.0, read by the worker before the call
    finally:
        lazy.close()
    unscored = sandboxed(OpenEnvShaped, {}, "process")
    try:
        unscored.reset()
        assert (
            unscored.step(toolgym.ToolCall("echo", {"message": "hi"})).messages[0]["content"]
            == "hi"
        )
        assert unscored.get_reward() is None  # before: SandboxError "reports no reward"
    finally:
        unscored.close()
    with pytest.raises(SandboxError, match=r"binds tools in __init__ \(lookup\)"):
        sandboxed(PerInstance, {}, "process")


def test_an_environment_without_its_own_init_refuses_unknown_arguments():
    """Issue 25 item 9: `Board(size=3)` on a class without `__init__` used to be accepted and
    the argument silently dropped."""

    class Plain(toolgym.Environment):
        def reset(self) -> str:
            return "ready"

    with pytest.raises(TypeError, match="unexpected keyword argument 'size'"):
        Plain(size=3)
    assert toolgym.as_environment(Plain()).reset(seed=0) == "ready"
