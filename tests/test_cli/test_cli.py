"""The `toolgym` command: ENV forms and their errors, the episode display, `eval --output`, and
`train` (flags generated from GRPOConfig, config files, a tiny real run, two processes)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_group
from killed_runs import DYING_MODEL, HEARD_ENV

from toolgym.agents.limits import AgentLimits
from toolgym.agents.trajectory import Sample, Trajectory, load_jsonl
from toolgym.algorithms.config import GRPOConfig, RLOOConfig
from toolgym.cli import build_parser, main
from toolgym.cli.config_args import field_docs, resolve_config
from toolgym.cli.env_spec import resolve_env
from toolgym.cli.errors import CLIError
from toolgym.cli.show import print_trajectory

ROOT = Path(__file__).resolve().parents[2]

ECHO_ENV = '''
import toolgym

LIMIT = 3


class Echo(toolgym.Environment):
    """Say the secret word back."""

    def reset(self, word: str = "apple") -> None:
        self.word = word

    def say(self, word: str) -> str:
        """Say a word.

        Args:
            word: The word.
        """
        self.done = True
        self.reward = float(word == self.word)
        return "right" if self.reward else "wrong"


class NoReset:
    pass


def make_echo(word_length: int = 5):
    return Echo()
'''

ROWS = [
    {"prompt": [{"role": "user", "content": "Say apple with the say tool."}], "word": "apple"},
    {"prompt": "Say pear with the say tool.", "word": "pear"},
]


@pytest.fixture
def echo(tmp_path: Path) -> tuple[Path, Path]:
    """A custom environment file and a dataset JSONL for it."""
    env_file = tmp_path / "echo_env.py"
    env_file.write_text(ECHO_ENV)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return env_file, rows


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model and its tokenizer, saved as a folder."""
    from toolgym.testing import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _help(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


# -- the commands and their help -------------------------------------------------------------
def test_toolgym_help_lists_every_command(capsys):
    out = _help(["--help"], capsys)
    for command in ("envs", "play", "eval", "train", "view"):
        assert re.search(rf"^\s+{command}\s", out, flags=re.MULTILINE), command
        assert f"toolgym {command}" in out  # the usage lines of the description


def test_view_help(capsys):
    out = _help(["view", "--help"], capsys)
    assert "--port" in out and "--tokenizer" in out and "--open" in out


def test_python_dash_m_toolgym_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "toolgym", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "train" in done.stdout and "view" in done.stdout


def test_train_help_lists_every_config_field_with_its_first_sentence(capsys):
    """Generated from the dataclass: a field added to GRPOConfig shows up without more code."""
    squeezed = re.sub(r"\s+", "", _help(["train", "--help"], capsys))  # argparse wraps lines

    def listed(cls: type) -> None:
        docs = field_docs(cls)
        for field in dataclasses.fields(cls):
            assert docs.get(field.name), f"{cls.__name__}.{field.name} has no documentation"
            first_sentence = re.split(r"(?<=\.)\s", docs[field.name])[0]
            assert re.sub(r"\s+", "", first_sentence) in squeezed, field.name
            if field.name != "limits":  # the nested dataclass: a section of its own flags
                assert f"--{field.name.replace('_', '-')}" in squeezed, field.name

    listed(GRPOConfig)
    listed(AgentLimits)  # --max-turns, --max-new-tokens, ...
    assert "--no-progress-bar" in squeezed and "{hf,vllm,vllm-server}" in squeezed


# -- config file and flags -------------------------------------------------------------------
def _train_args(*extra: str):
    return build_parser().parse_args(["train", "Wordle-v0", "--model", "m", *extra])


def test_config_file_then_flags_override(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "learning_rate: 1e-5\n"  # YAML reads this as a string: converted to the field's float
        "max_steps: 7\n"
        "num_generations: 4\n"
        "limits:\n  max_turns: 3\n"
        "max_new_tokens: 99\n"  # a nested field written flat
        "report_to: [tensorboard]\n"
    )
    args = _train_args("--max-steps", "2", "--max-new-tokens", "16", "--no-progress-bar")
    built = resolve_config(GRPOConfig, str(config), args)
    assert built.learning_rate == 1e-5 and built.num_generations == 4  # from the file
    assert built.max_steps == 2 and built.limits.max_new_tokens == 16  # flags win
    assert built.limits.max_turns == 3 and built.progress_bar is False
    assert built.limits.max_episode_tokens == 2048 and built.adam_betas == (0.9, 0.99)  # defaults
    assert built.report_to == ["tensorboard"]


def test_json_config_and_structured_flags(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"adam_betas": [0.8, 0.9], "limits": {"tool_timeout": 5}}))
    args = _train_args("--lora", '{"r": 4}', "--max-seconds", "none", "--scale-rewards", "batch")
    built = resolve_config(RLOOConfig, str(config), args)
    assert built.adam_betas == (0.8, 0.9) and built.limits.tool_timeout == 5.0
    assert built.lora == {"r": 4} and built.max_seconds is None and built.scale_rewards == "batch"
    assert built.advantage == "rloo" and built.output_dir == "runs/rloo"  # RLOOConfig defaults


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "lerning_rate: 0.1\n",
            "unknown key 'lerning_rate' (GRPOConfig has no such field; "
            "did you mean 'learning_rate'?)",
        ),
        ("limits:\n  max_turn: 3\n", "unknown key 'limits.max_turn'"),
        ("loss_type: ppo\n", "loss_type: 'ppo' is not one of"),
        ("max_steps: many\n", "max_steps: expected a number"),
        ("num_generations: 1\n", "num_generations must be at least 2"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path, capsys, text, message):
    config = tmp_path / "run.yaml"
    config.write_text(text)
    assert main(["train", "Wordle-v0", "--model", "m", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_the_settings_a_run_writes_read_back_as_a_config_file(tmp_path):
    config = GRPOConfig(adam_betas=(0.8, 0.9), lora={"r": 2}, report_to=["wandb"])
    config.limits.max_turns = 3
    written = tmp_path / "train_config.json"
    written.write_text(json.dumps(config.to_dict()))
    assert resolve_config(GRPOConfig, str(written), _train_args()) == config


def test_bad_flag_values_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "Wordle-v0", "--model", "m", "--max-steps", "x"])
    assert exited.value.code == 2 and "invalid int value: 'x'" in capsys.readouterr().err


# -- ENV: ids, files, modules ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-sessions", "0"], "--max-sessions must be at least 1"),
        (["--session-idle-timeout", "0"], "--session-idle-timeout must be a positive"),
        (["--session-idle-timeout", "nan"], "--session-idle-timeout must be a positive"),
        (["--token", "short"], "--token must be at least 16"),
        (["--token", "a-token-with-a:colon"], "without spaces or ':'"),
    ],
)
@pytest.mark.parametrize("command", [["serve", "Wordle-v0"], ["endpoint", "--model", "never"]])
def test_listening_flags_are_checked_before_anything_starts(capsys, command, flags, message):
    """`toolgym serve` and `toolgym endpoint` refuse bad limits and tokens as one-line errors,
    before an environment or a model is loaded."""
    assert main([*command, *flags, "--port", "0"]) == 2
    assert message in capsys.readouterr().err


def test_resolve_env_forms(echo):
    env_file, _ = echo
    registered = resolve_env("Wordle-v0")
    assert registered.target == "Wordle-v0" and len(registered.dataset(3, seed=0)) == 3
    by_module = resolve_env("toolgym.builtin_envs.wordle:Wordle")  # Wordle-v0's entry point
    assert by_module.target.__name__ == "Wordle" and by_module.registered.id == "Wordle-v0"
    assert len(by_module.dataset(2, seed=0)) == 2
    by_file = resolve_env(f"{env_file}:Echo")
    env = by_file.make()
    env.reset(word="kiwi", seed=0)
    assert [t["function"]["name"] for t in env.tools] == ["say"]
    with pytest.raises(CLIError, match=re.escape("--dataset FILE.jsonl")):
        by_file.dataset(2)
    factory = resolve_env(f"{env_file}:make_echo")
    made, kwargs = factory.trainer_env({"word_length": 3})
    assert kwargs is None and type(made()).__name__ == "Echo"  # arguments bound to the factory


def test_an_env_file_imports_the_modules_beside_it(tmp_path, monkeypatch):
    """`path/file.py:Class` puts the file's folder on sys.path, as `python path/file.py` does."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sibling_words_xyz.py").write_text("WORDS = ['kiwi', 'pear']\n")
    (folder / "sibling_env_xyz.py").write_text(
        "from sibling_words_xyz import WORDS\n\n"
        "class Picker:\n"
        "    def reset(self, **row):\n"
        "        self.reward = 0.0\n\n"
        "    def words(self) -> str:\n"
        '        """The words."""\n'
        "        return ' '.join(WORDS)\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "sibling_words_xyz", raising=False)
    monkeypatch.delitem(sys.modules, "sibling_env_xyz", raising=False)
    resolved = resolve_env(f"{folder / 'sibling_env_xyz.py'}:Picker")
    assert resolved.target.__name__ == "Picker" and str(folder) in sys.path
    sys.modules.pop("sibling_words_xyz", None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.py:Echo", "no such file"),
        ("{file}:Ech", "has no attribute 'Ech'; did you mean 'Echo'?"),
        ("{file}:NoReset", "class NoReset is not an environment"),
        ("{file}:LIMIT", "is a int, not an environment class or a factory"),
        ("Wordl-v0", "No environment registered with id 'Wordl-v0'. Did you mean: Wordle-v0?"),
        ("no_such_module_xyz:Env", "no module named 'no_such_module_xyz'"),
        ("bad id!", "malformed environment id"),
    ],
)
def test_bad_env_specs_are_one_line_errors(echo, capsys, spec, message):
    env_file, _ = echo
    assert main(["play", spec.format(file=env_file), "--model", "never-loaded"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_factory_cannot_go_into_a_sandbox(echo, capsys):
    env_file, rows = echo
    argv = ["play", f"{env_file}:make_echo", "--dataset", str(rows), "--sandbox", "process"]
    assert main([*argv, "--model", "never-loaded"]) == 2  # before the model is loaded
    assert "--sandbox process needs an environment class" in capsys.readouterr().err


def test_a_class_without_a_dataset_needs_the_flag(echo, capsys):
    env_file, _ = echo
    assert main(["eval", f"{env_file}:Echo", "--model", "never-loaded"]) == 2
    assert "pass --dataset FILE.jsonl" in capsys.readouterr().err


def test_a_broken_dataset_row_names_its_line(echo, tmp_path, capsys):
    env_file, _ = echo
    rows = tmp_path / "broken.jsonl"
    rows.write_text('{"prompt": "fine"}\n{"word": "no prompt"}\n')
    assert main(["play", f"{env_file}:Echo", "--dataset", str(rows), "--model", "x"]) == 2
    assert "broken.jsonl, line 2: expected an object with a 'prompt'" in capsys.readouterr().err


# -- play and eval ---------------------------------------------------------------------------
def _episode() -> Trajectory:
    return Trajectory(
        [Sample([1])],
        messages=[
            {"role": "user", "content": "Say [bold]apple[/bold]."},
            {
                "role": "assistant",
                "content": "Let me try.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "say", "arguments": {"word": "pear"}}}
                ],
            },
            {"role": "tool", "name": "say", "content": "wrong"},
            {"role": "tool", "name": "shout", "content": "Error: unknown tool 'shout'."},
        ],
        reward=0.0,
        status="max_turns",
        metrics={"turns": 2, "tool_calls": 2, "tool_failures": 1},
    )


def test_an_episode_in_a_terminal_has_colours(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    from rich.console import Console

    out = io.StringIO()
    print_trajectory(_episode(), Console(file=out, force_terminal=True, color_system="standard"))
    text = out.getvalue()
    assert "\x1b[" in text
    assert "\x1b[31mError: unknown tool 'shout'." in text  # the failed call's result in red
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "Say [bold]apple[/bold]." in plain  # message text is not read as markup
    assert 'say({"word": "pear"})' in plain and "tool shout (failed)" in plain
    assert "status max_turns · reward 0.000 · turns 2 · tool calls 2 (1 failed)" in plain


def test_model_text_cannot_drive_the_terminal(monkeypatch):
    from rich.console import Console

    episode = _episode()
    episode.messages[1]["content"] = "\x1b]0;pwned\x07 \x1b[2J cleared \x9b"
    out = io.StringIO()
    print_trajectory(episode, Console(file=out, force_terminal=True, color_system="standard"))
    text = out.getvalue()
    assert "\x1b]0;" not in text and "\x1b[2J" not in text and "\x9b" not in text
    assert "\\x1b]0;pwned\\x07" in text  # shown escaped instead


def test_optional_structured_flags_take_none_and_tuples_are_checked(tmp_path):
    args = _train_args("--reward-weights", "none", "--lora", "none", "--epsilon-high", "none")
    built = resolve_config(GRPOConfig, None, args)
    assert (built.reward_weights, built.lora, built.epsilon_high) == (None, None, None)
    built = resolve_config(GRPOConfig, None, _train_args("--reward-weights", "1,0.5"))
    assert built.reward_weights == [1.0, 0.5]
    # a list flag is one word, so ENV written after it is never taken as one of its values
    args = build_parser().parse_args(
        ["train", "--model", "m", "--report-to", "tensorboard,wandb", "Wordle-v0"]
    )
    assert args.env == "Wordle-v0"
    assert resolve_config(GRPOConfig, None, args).report_to == ["tensorboard", "wandb"]
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"adam_betas": [0.9, 0.95, 0.1]}))
    with pytest.raises(CLIError, match="adam_betas: expected 2 values, got 3"):
        resolve_config(GRPOConfig, str(config), _train_args())


def test_an_episode_piped_is_plain_text(monkeypatch):
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(variable, raising=False)
    from rich.console import Console

    out = io.StringIO()
    print_trajectory(_episode(), Console(file=out))
    assert "\x1b" not in out.getvalue() and "tool say" in out.getvalue()


def test_play_and_eval_a_file_environment(echo, model_folder, tmp_path, capsys):
    env_file, rows = echo
    common = [f"{env_file}:Echo", "--dataset", str(rows), "--model", str(model_folder)]
    common += ["--max-new-tokens", "8", "--max-turns", "2", "--env-kwargs", "{}"]
    assert main(["play", *common]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out  # captured: not a terminal
    assert "user" in out and "Say apple with the say tool." in out and "assistant" in out
    assert "=== status" in out
    output = tmp_path / "episodes" / "eval.jsonl"
    assert main(["eval", *common, "-n", "5", "--output", str(output)]) == 0
    assert f"toolgym view {output}" in capsys.readouterr().out
    episodes = load_jsonl(output)
    assert len(episodes) == 2  # every row of the dataset (fewer than -n)
    assert episodes[1].messages[0]["content"].startswith("Say pear")


def test_eval_rollouts_report_resume_and_compare(echo, model_folder, tmp_path, capsys):
    env_file, rows = echo
    common = [f"{env_file}:Echo", "--dataset", str(rows), "--model", str(model_folder)]
    common += ["--max-new-tokens", "8", "--max-turns", "2", "--temperature", "1.0"]
    output, report = tmp_path / "eval.jsonl", tmp_path / "base.json"
    args = [*common, "--rollouts", "3", "--concurrency", "4", "--output", str(output)]
    assert main(["eval", *args, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "2 rows x 3 rollouts" in out and "pass@1 " in out and "pass@3 " in out
    episodes = load_jsonl(output)
    keys = [(t.metrics["eval_row"], t.metrics["eval_rollout"]) for t in episodes]
    assert sorted(keys) == [(r, j) for r in range(2) for j in range(3)]
    written = json.loads(report.read_text())
    assert (written["rows"], written["rollouts"]) == (2, 3)
    assert [len(r["rewards"]) for r in written["per_row"]] == [3, 3]
    assert written["settings"]["temperature"] == 1.0 and written["settings"]["engine"] == "hf"
    assert set(written["pass_at_k"]) == {"1", "2", "3"}
    # interrupted after four episodes: --resume plays the other two and keeps the four
    lines = output.read_text().splitlines()
    output.write_text("\n".join(lines[:4]) + "\n")
    resumed = tmp_path / "resumed.json"
    assert main(["eval", *args, "--resume", "--report", str(resumed)]) == 0
    capsys.readouterr()
    assert output.read_text().splitlines()[:4] == lines[:4]
    assert len(load_jsonl(output)) == 6
    assert json.loads(resumed.read_text())["settings"]["episodes_played_now"] == 2
    # a file of another evaluation (here: of two rows, resumed as one) is not resumed
    assert main(["eval", *args, "--resume", "-n", "1"]) == 2
    assert "holds an episode of another evaluation" in capsys.readouterr().err
    # the paired comparison of two reports, and its refusals
    assert main(["eval", "--compare", str(report), str(resumed)]) == 0
    out = capsys.readouterr().out
    assert "paired over 2 rows (new - base):" in out and "pass@1:" in out
    assert main(["eval", "--compare", str(report), str(output)]) == 2
    assert "cannot read the report" in capsys.readouterr().err
    assert main(["eval", "--model", "x"]) == 2
    assert "ENV is required" in capsys.readouterr().err
    assert main(["eval", *common, "--rollouts", "0"]) == 2


TALK_ENV = """
import toolgym


class Talk(toolgym.Environment):
    def reset(self, **row):
        self.reward = 0.0

    def user_turn(self, answer):
        self.reward = float(len(answer) % 2)  # what the last answer was: varies by branch
        return "Go on."

    def say(self, word: str) -> str:
        \"\"\"Say a word.

        Args:
            word: The word.
        \"\"\"
        return word
"""


def test_eval_searches_from_a_forked_state(monkeypatch, tmp_path, capsys):
    """`--fork-at-turn 1 --rollouts 3`: each row is played one turn once, then forked; the
    three rollouts share that turn token for token and go on on their own (the model: a
    script whose answers differ call by call, so the branches do)."""
    from toolgym.agents import Agent, AgentLimits, ScriptedEngine
    from toolgym.cli import evaluate as evaluate_command
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    answers = [
        tokenizer.encode(f"{'x' * n}<|im_end|>", add_special_tokens=False) for n in (1, 2, 3, 4)
    ]
    engine = ScriptedEngine(answers, context_length=4096)

    def scripted_agent(args):
        return Agent(engine, tokenizer, limits=AgentLimits(max_turns=args.max_turns))

    monkeypatch.setattr(evaluate_command, "build_agent", scripted_agent)
    env_file = tmp_path / "talk_env.py"
    env_file.write_text(TALK_ENV)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Talk {i}."}) + "\n" for i in range(2)))
    common = [f"{env_file}:Talk", "--dataset", str(rows), "--model", "scripted", "--max-turns", "3"]
    output, report = tmp_path / "search.jsonl", tmp_path / "search.json"
    args = [*common, "--rollouts", "3", "--fork-at-turn", "1", "--concurrency", "4"]
    assert main(["eval", *args, "--output", str(output), "--report", str(report)]) == 0
    assert "2 rows x 3 rollouts" in capsys.readouterr().out
    episodes = load_jsonl(output)
    assert len(episodes) == 6 and all(t.metrics["eval_branched"] == 1.0 for t in episodes)
    for row in range(2):
        tree = [t for t in episodes if t.metrics["eval_row"] == row]
        assert len({t.messages[1]["content"] for t in tree}) == 1  # the root's turn, shared
        assert len({t.messages[3]["content"] for t in tree}) > 1  # the branches' own turns
        assert all(t.status == "max_turns" and len(t.messages) == 7 for t in tree)
        for t in tree:  # the shared turn ("x", then the user's "Go on.") is masked in each
            sampled = [c for c, m in zip(t.completion_ids, t.loss_mask, strict=True) if m]
            own = t.messages[3]["content"] + "<|im_end|>" + t.messages[5]["content"]
            assert tokenizer.decode(sampled) == own + "<|im_end|>"
    written = json.loads(report.read_text())
    assert written["settings"]["fork_at_turn"] == 1
    assert set(written["pass_at_k"]) == {"1", "2", "3"}
    assert main(["eval", *common, "--fork-at-turn", "1"]) == 2  # one rollout: nothing to search
    assert "--rollouts of at least 2" in capsys.readouterr().err


KILLED_EVAL = (
    DYING_MODEL
    + """
import sys

from toolgym.agents import Agent, AgentLimits, ScriptedEngine
from toolgym.cli import evaluate as evaluate_command, main

kill_at, calls_file, *args = sys.argv[1:]


def scripted_agent(args):
    engine = ScriptedEngine(script, context_length=4096)
    return Agent(engine, tokenizer, limits=AgentLimits(max_turns=args.max_turns))


evaluate_command.build_agent = scripted_agent
sys.exit(main(["eval", *args]))
"""
)


NO_BWRAP = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") != "1" and shutil.which("bwrap") is None


@pytest.mark.parametrize(
    "sandbox",
    [
        "local",
        pytest.param(
            "process",
            marks=pytest.mark.skipif(
                NO_BWRAP,
                reason="bubblewrap is not installed (scripts/sandbox_setup.sh)",
            ),
        ),
    ],
)
def test_eval_resumes_a_killed_episode_from_its_snapshot(tmp_path, sandbox):
    """`--save-in-flight`: an evaluation killed (SIGKILL) in the middle of its episodes'
    third turn leaves each episode's last kept turn beside `--output`; `--resume` restores
    the environment's state from it and plays only the turns that were left, on the kept
    tokens, and the folder is empty once the episodes are recorded. In a process sandbox the
    kept state is the worker's own pickle, restored into a new worker after the restart."""
    env_file, rows = tmp_path / "heard_env.py", tmp_path / "rows.jsonl"
    env_file.write_text(HEARD_ENV)
    rows.write_text("".join(json.dumps({"prompt": f"Talk {i}."}) + "\n" for i in range(2)))
    driver = tmp_path / "driver.py"
    driver.write_text(KILLED_EVAL)
    output = tmp_path / "eval.jsonl"
    args = [f"{env_file}:Heard", "--dataset", str(rows), "--model", "scripted"]
    args += ["--max-turns", "4", "--output", str(output), "--save-in-flight"]
    args += ["--sandbox", sandbox]

    def run(kill_at: int, calls: Path, *extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(driver), str(kill_at), str(calls), *args, *extra]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    first = run(5, tmp_path / "first-calls")  # two episodes, four generations, then killed
    assert first.returncode == -9, first.stderr
    assert output.read_text() == ""  # nothing recorded: the chunk never ended
    kept = sorted(p.name for p in (tmp_path / "eval.jsonl.in-flight").iterdir())
    assert kept == ["0-0.pkl", "1-0.pkl"]
    again = run(0, tmp_path / "again-calls", "--resume")
    assert again.returncode == 0, again.stderr
    episodes = load_jsonl(output)
    assert len(episodes) == 2
    resumed_at = [int(t.metrics["resumed_at_turn"]) for t in episodes]
    assert all(turn in (1, 2) for turn in resumed_at)  # the last turn each had kept
    generated = len((tmp_path / "again-calls").read_text().splitlines())
    assert generated == sum(4 - turn for turn in resumed_at)  # only the turns left
    from toolgym.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    for t in episodes:
        assert t.status == "max_turns" and t.reward == 4.0  # the restored state heard all 4
        assert len(t.messages) == 9 and t.messages[2]["content"] == "Go on."
        sampled = [c for c, m in zip(t.completion_ids, t.loss_mask, strict=True) if m]
        answers = [m["content"] + "<|im_end|>" for m in t.messages if m["role"] == "assistant"]
        assert tokenizer.decode(sampled) == "".join(answers)  # the kept turns train too
    assert list((tmp_path / "eval.jsonl.in-flight").iterdir()) == []
    assert main(["eval", *args[:5], "--save-in-flight"]) == 2  # no --output to keep them by


# -- train -----------------------------------------------------------------------------------
def _tiny_train_args(env_file: Path, rows: Path, model: Path, output: Path) -> list[str]:
    return [
        "train",
        f"{env_file}:Echo",
        "--model",
        str(model),
        "--dataset",
        str(rows),
        "--engine",
        "hf",
        "--max-steps",
        "1",
        "--prompts-per-step",
        "1",
        "--num-generations",
        "2",
        "--micro-batch-size",
        "2",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "8",
        "--max-episode-tokens",
        "64",
        "--parser",
        "hermes",
        "--no-progress-bar",
        "--output-dir",
        str(output),
    ]


def test_train_a_file_environment_end_to_end(echo, model_folder, tmp_path, capsys):
    env_file, rows = echo
    output = tmp_path / "run"
    assert main(_tiny_train_args(env_file, rows, model_folder, output)) == 0
    metrics = (output / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1]
    assert (output / "checkpoint-1" / "trainer_state.json").exists()
    assert any((output / "checkpoint-1").glob("*.safetensors"))
    settings = json.loads((output / "train_config.json").read_text())
    assert settings["num_generations"] == 2 and settings["limits"]["max_new_tokens"] == 8
    out = capsys.readouterr().out
    assert "trained 1 step" in out and str(output / "checkpoint-1") in out


@pytest.mark.slow  # over 8 s in CI: out of `make quick`
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo) path")
@pytest.mark.timeout(300)
def test_train_under_accelerate_launch_with_two_processes(echo, model_folder, tmp_path):
    """`accelerate launch -m toolgym train ...`: one group of 2 split across 2 processes."""
    env_file, rows = echo
    output = tmp_path / "run"
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["-m", "toolgym", *_tiny_train_args(env_file, rows, model_folder, output)]
    done = run_group(command, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]  # written once, by the main process
    assert done.stdout.count("trained 1 step") == 1
    assert (output / "checkpoint-1" / "rng-1.pt").exists()  # the second process's states
