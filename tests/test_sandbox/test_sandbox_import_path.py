"""No folder the sandbox can write is on the worker's import path (issue 43, family 2).

The attack, as reproduced before the fix: the environment's module lived under /tmp (CI's
clones do; so does pytest's tmp_path), the worker's import path started with its folder, and
bubblewrap made that folder inside the sandbox's writable /tmp; model code planted
`fractions.py` there, and a grader that imports lazily (`from fractions import Fraction`
inside `final_answer`) ran the model's module: a wrong answer scored 1.0. Here the model's
code plants `fractions.py` in every folder it can find or make, and renames every folder
under /tmp it can to make a new one in its place; the grader must still grade, on the
process and docker backends (`test_ray_attacks.py` runs it through Ray). The worker's own
check (`toolgym/sandbox/boot.py`) is tested on real folders, as an unprivileged account.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import toolgym
from toolgym.sandbox import sandboxed
from toolgym.sandbox.imports import TOOLGYM_SOURCE

REQUIRED = os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") == "1"


def _docker_ready() -> bool:
    from toolgym.sandbox.docker import docker_ready

    return docker_ready()


BACKENDS = [
    pytest.param(
        "process",
        marks=pytest.mark.skipif(
            not REQUIRED and shutil.which("bwrap") is None, reason="bubblewrap is not installed"
        ),
    ),
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(
                not REQUIRED and not _docker_ready(), reason="no Docker daemon or sandbox image"
            ),
        ],
    ),
]

LAZY_GRADER = '''
import sys

from toolgym.builtin_envs.python_repl import PythonREPL


class LazyGrader(PythonREPL):
    """Grades fractions, importing `fractions` only when it grades."""

    def imported(self) -> bool:
        """Whether `fractions` is imported in this process yet."""
        return "fractions" in sys.modules

    def final_answer(self, text: str) -> None:
        from fractions import Fraction  # imported lazily, at grading time

        if self.answer is not None and not self.done:
            self.reward = float(Fraction(text.strip()) == Fraction(self.answer))
            self.done = True
'''


def plant_code(known: list[str]) -> str:
    """Model code: `fractions.py` (every fraction equal) in every folder it can write or make:
    the `known` host folders, /opt's, every folder under /tmp and /dev/shm; and every folder
    under /tmp it can rename is renamed and made again with the module in it."""
    return textwrap.dedent(
        f"""
        import os
        PLANT = "class Fraction:\\n    def __init__(self, x): pass\\n"
        PLANT += "    def __eq__(self, other): return True\\n"
        def plant(folder):
            try:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "fractions.py"), "w") as stream:
                    stream.write(PLANT)
                return True
            except OSError:
                return False
        folders = set({known!r})
        for top in ("/opt", "/tmp", "/dev/shm"):
            for root, dirs, files in os.walk(top):
                folders.add(root)
        planted = sorted(f for f in folders if plant(f))
        renamed = []
        for root in sorted((r for r, _, _ in os.walk("/tmp")), key=len, reverse=True):
            if root == "/tmp":
                continue
            try:
                os.rename(root, root + ".moved")
            except OSError:
                continue
            renamed.append(root)
            plant(root)
        print("planted", planted)
        print("renamed", renamed)
        """
    )


def write_lazy_grader(folder: Path) -> None:
    folder.mkdir(mode=0o755, exist_ok=True)
    (folder / "lazy_grader_env.py").write_text(LAZY_GRADER)
    (folder / "lazy_grader_env.py").chmod(0o644)


def grade_after_planting(env, known: list[str]) -> tuple[str, float, float]:
    """What the model read, the reward of a wrong answer after planting, and of the right
    answer in the next episode."""
    env.reset(task="1/3 + 1/6?", answer="1/2")
    imported = env.step(toolgym.ToolCall("imported", {})).messages[0]["content"]
    assert imported == "false", "the grader's module is imported already: the test proves nothing"
    result = env.step(toolgym.ToolCall("run", {"code": plant_code(known)}))
    read = result.messages[0]["content"]
    env.final_answer("7/8")
    wrong = env.reward
    env.reset(task="1/3 + 1/6?", answer="1/2")
    env.final_answer("1/2")
    return read, wrong, env.reward


@pytest.mark.parametrize("where", BACKENDS)
def test_a_module_planted_by_the_model_never_reaches_a_lazy_grader(where, tmp_path, monkeypatch):
    folder = tmp_path / "project"  # under /tmp, behind pytest's private (0700) folders
    write_lazy_grader(folder)
    monkeypatch.syspath_prepend(str(folder))
    from lazy_grader_env import LazyGrader

    env = sandboxed(LazyGrader, {"run_timeout": 20.0}, where, call_timeout=60)
    try:
        known = [str(folder), str(TOOLGYM_SOURCE.parent), str(TOOLGYM_SOURCE)]
        read, wrong, right = grade_after_planting(env, known)
    finally:
        env.close()
        sys.modules.pop("lazy_grader_env", None)
    assert "planted ['" in read and "'/tmp'" in read, read  # the attack ran: /tmp is its own
    assert wrong == 0.0, f"a planted module graded a wrong answer {wrong}: {read}"
    assert right == 1.0
    assert not (folder / "fractions.py").exists()  # and nothing reached the host


@pytest.mark.skipif(shutil.which("bwrap") is None and not REQUIRED, reason="no bubblewrap")
def test_the_process_workers_import_path_is_fixed_and_read_only(tmp_path, monkeypatch):
    """toolgym at /opt/toolgym, the module at /opt/module, then the interpreter's entries:
    nothing of the project's folder or /tmp; and the worker checked every entry itself."""
    from sandbox_envs import Prober

    from toolgym.sandbox.view import interpreter_entries

    env = sandboxed(Prober, {}, "process")
    try:
        env.reset()
        path = json.loads(env.step(toolgym.ToolCall("import_path", {})).messages[0]["content"])
        source = env.step(toolgym.ToolCall("exists", {"path": str(TOOLGYM_SOURCE)}))
    finally:
        env.close()
    assert path[:2] == ["/opt/module", "/opt/toolgym"], path
    assert path[2 : 2 + len(interpreter_entries())] == interpreter_entries()
    # nothing under the sandbox's writable folders but the interpreter's own entries (a venv
    # cloned under /tmp, as CI's is: bound read-only, guarded, and checked by the worker)
    interpreter = set(interpreter_entries())
    extra = [e for e in path if e not in interpreter and e.startswith(("/tmp", "/dev/shm"))]
    assert not extra, path
    if not str(TOOLGYM_SOURCE).startswith(sys.prefix):  # toolgym's own folder is not bound
        assert source.messages[0]["content"] == "false"


BOOT = TOOLGYM_SOURCE / "sandbox" / "boot.py"


def _boot(boot: Path, entries: list[str]) -> subprocess.CompletedProcess:
    """`boot` (a copy of boot.py) with this import path and the check on, as nobody (an
    account with the sandbox's view of permissions): it refuses before importing toolgym,
    or gets as far as importing it (which fails here: toolgym is not on the path given)."""

    def nobody() -> None:
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)

    env = {"TOOLGYM_SYS_PATH": os.pathsep.join(entries), "TOOLGYM_CHECK_SYS_PATH": "1"}
    return subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-B", str(boot)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=nobody,
    )


@pytest.mark.skipif(os.getuid() != 0, reason="checks as another account need root")
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no /usr/bin/python3")
def test_the_worker_refuses_an_import_path_the_sandbox_could_write():
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="toolgym-boot-"))
    try:
        base.chmod(0o755)
        shutil.copy(BOOT, base / "boot.py")
        (base / "boot.py").chmod(0o644)
        (base / "layer").mkdir(mode=0o755)
        safe = base / "layer" / "safe"  # root's, 0755, in a folder only root may write
        safe.mkdir(mode=0o755)
        open_to_all = base / "layer" / "open"  # anyone may write it
        open_to_all.mkdir()
        open_to_all.chmod(0o777)
        renamable = open_to_all / "inside"  # not writable, but its folder is: rename, remake
        renamable.mkdir(mode=0o755)
        cases = {
            str(safe): None,
            str(open_to_all): "is writable by the sandbox",
            str(open_to_all / "missing"): "is missing and",
            str(renamable): "which the sandbox could replace",
        }
        for entry, refusal in cases.items():
            done = _boot(base / "boot.py", [entry])
            if refusal is None:  # passed the check, then failed to import toolgym
                assert "refused" not in done.stderr and "toolgym" in done.stderr, done.stderr
            else:
                assert done.returncode == 78, (entry, done.stderr)
                expected = f"refused to start: the import path entry {entry} "
                assert expected in done.stderr and refusal in done.stderr, done.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)
