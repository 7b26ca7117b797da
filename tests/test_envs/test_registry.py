"""register / make / spec / list_envs, entry points of an installed package, gymnasium ids."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import toolgym
import toolgym.gym
from toolgym import registry


class Echo(toolgym.Environment):
    def __init__(self, prefix: str = ">") -> None:
        self.prefix = prefix

    def reset(self) -> str | None:
        return None

    def echo(self, text: str) -> str:
        """Repeat the text.

        Args:
            text: What to repeat.
        """
        return f"{self.prefix} {text}"


@pytest.fixture
def clean_registry():
    """Registrations made by a test are removed afterwards."""
    before = dict(registry._registry)
    gym_before = set(gymnasium.registry)
    yield
    registry._registry.clear()
    registry._registry.update(before)
    for gym_id in set(gymnasium.registry) - gym_before:
        del gymnasium.registry[gym_id]


def echo_of(env: toolgym.Environment, text: str = "hi") -> str:
    env.reset()
    return env.step(toolgym.ToolCall("echo", {"text": text})).messages[0]["content"]


def test_builtins_are_listed():
    assert {"Wordle-v0", "Arithmetic-v0", "GuessNumber-v0"} <= set(toolgym.list_envs())


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.parametrize(
    "entry_point",
    [Echo, lambda prefix=">": Echo(prefix), f"{__name__}:Echo"],
    ids=["class", "callable", "module:attr"],
)
def test_register_and_make(entry_point):
    toolgym.register("Echo-v0", entry_point, prefix="#")
    assert echo_of(toolgym.make("Echo-v0")) == "# hi"
    assert echo_of(toolgym.make("Echo-v0", prefix="!")) == "! hi"
    assert toolgym.spec("Echo-v0").kwargs == {"prefix": "#"}


@pytest.mark.usefixtures("clean_registry")
def test_namespaced_ids_and_their_gymnasium_id():
    spec = toolgym.register("myorg/Echo-v2", Echo)
    assert (spec.namespace, spec.name, spec.version) == ("myorg", "Echo", 2)
    assert toolgym.list_envs(namespace="myorg") == ["myorg/Echo-v2"]
    assert spec.gymnasium_id == "toolgym/myorg.Echo-v2"
    env = gymnasium.make("toolgym/myorg.Echo-v2")
    _obs, _ = env.reset(seed=0)
    assert (
        env.step('<tool_call>{"name": "echo", "arguments": {"text": "yo"}}</tool_call>')[0]
        == "echo: > yo"
    )


@pytest.mark.usefixtures("clean_registry")
def test_duplicate_registration_warns_and_replaces():
    toolgym.register("Echo-v0", Echo)
    with pytest.warns(UserWarning, match="Overriding environment 'Echo-v0'"):
        toolgym.register("Echo-v0", Echo, prefix="2")
    assert echo_of(toolgym.make("Echo-v0")) == "2 hi"


def test_unknown_id_suggests_close_ids():
    with pytest.raises(toolgym.UnknownEnvironmentError, match=r"Did you mean: Wordle-v0\?"):
        toolgym.make("Wordel-v0")
    with pytest.raises(toolgym.UnknownEnvironmentError, match=r"Did you mean: Wordle-v0\?"):
        toolgym.spec("wordle-v1")


def test_make_names_what_it_takes_when_given_a_class():
    with pytest.raises(TypeError, match=r"registered id or an EnvSpec, not type.*env_factory"):
        toolgym.make(Echo)  # type: ignore[arg-type]


def test_malformed_ids_are_rejected():
    with pytest.raises(ValueError, match="malformed environment id"):
        toolgym.register("a/b/c-v0", Echo)
    with pytest.raises(ValueError, match="malformed environment id"):
        toolgym.register("has space-v0", Echo)


def test_plain_entry_point_result_is_adapted():
    class NotAnEnv:
        pass

    with pytest.raises(TypeError, match="no reset"):
        toolgym.as_environment(NotAnEnv())


def test_dataset_builder_returns_a_datasets_dataset():
    dataset = toolgym.spec("Wordle-v0").dataset(8, seed=3)
    assert len(dataset) == 8
    assert set(dataset.column_names) == {"prompt", "answer"}
    assert dataset[0]["prompt"][0]["role"] == "user"
    assert toolgym.spec("Wordle-v0").dataset(8, seed=3)["answer"] == dataset["answer"]


@pytest.mark.usefixtures("clean_registry")
def test_spec_without_dataset_says_so():
    toolgym.register("Echo-v0", Echo)
    with pytest.raises(ValueError, match="no prompt dataset builder"):
        toolgym.spec("Echo-v0").dataset(2)


PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "toolgym-plugin-demo"
version = "0.0.1"

[project.entry-points."toolgym.envs"]
"demo/Shout-v0" = "toolgym_plugin_demo:Shout"
demo = "toolgym_plugin_demo:register_all"
"""

PLUGIN_MODULE = '''
import toolgym


class Shout:
    """A TRL-style plain class: no base class."""

    def reset(self, **kwargs):
        return None

    def shout(self, text: str) -> str:
        """Shout the text.

        Args:
            text: What to shout.
        """
        return text.upper()


def register_all():
    toolgym.register("demo/Whisper-v0", Shout, dataset=lambda n, seed: [{"prompt": "hi"}] * n)
'''


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory) -> Path:
    """A real distribution with toolgym entry points, pip-installed into a temporary folder."""
    source = tmp_path_factory.mktemp("plugin-src")
    (source / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (source / "toolgym_plugin_demo.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
    )
    return target


@pytest.mark.usefixtures("clean_registry")
def test_entry_points_of_an_installed_package(installed_plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(installed_plugin))
    registry.load_entry_points(reload=True)
    try:
        ids = toolgym.list_envs(namespace="demo")
        assert ids == ["demo/Shout-v0", "demo/Whisper-v0"]
        env = toolgym.make("demo/Shout-v0")
        env.reset()
        assert env.step(toolgym.ToolCall("shout", {"text": "hey"})).messages[0]["content"] == "HEY"
        assert len(toolgym.spec("demo/Whisper-v0").dataset(3)) == 3
        assert gymnasium.make("toolgym/demo.Shout-v0") is not None
    finally:
        sys.modules.pop("toolgym_plugin_demo", None)
