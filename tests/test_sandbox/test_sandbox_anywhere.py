"""A project anywhere works with the process sandbox (issue 42, item 4), without opening any
folder to other accounts.

Before: a root host ran workers as the account `toolgym-sandbox`, which had to pass through
every folder above the interpreter, the virtual environment, toolgym and the environment's
module; a project under a private folder (a home folder of mode 700, pytest's
/tmp/pytest-of-root) was refused ("toolgym-sandbox (uid 999) cannot read ...; let it in
(chmod o+x ...)"), and the set-up opened `/root`. Now the root host stages those folders
with bind mounts in the worker's own mount namespace (`toolgym.sandbox.scratch`): here a
host process whose virtual environment, toolgym package and environment module are reached
only through a 0700 folder under /tmp runs a model-code environment, grades it, and the
model's code can neither read the folder's siblings nor plant a module the grader imports
(the folders under /tmp that the binds pass through are guarded mount points).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
from test_sandbox_import_path import plant_code, write_lazy_grader

from toolgym.sandbox.imports import TOOLGYM_SOURCE

pytestmark = [
    pytest.mark.skipif(os.getuid() != 0, reason="workers of a non-root host are its own uid"),
    pytest.mark.skipif(
        shutil.which("bwrap") is None and os.environ.get("TOOLGYM_REQUIRE_SANDBOXES") != "1",
        reason="bubblewrap is not installed",
    ),
]

HOST = """
import json, sys
import toolgym
from lazy_grader_env import LazyGrader
from toolgym.sandbox import ProcessBackend, RemoteEnvironment

env = RemoteEnvironment(LazyGrader, {"run_timeout": 20.0}, backend=ProcessBackend())
try:
    env.reset(task="1/3 + 1/6?", answer="1/2")
    looked = env.step(toolgym.ToolCall("run", {"code": LOOK})).messages[0]["content"]
    planted = env.step(toolgym.ToolCall("run", {"code": PLANT})).messages[0]["content"]
    env.final_answer("7/8")
    wrong = env.reward
    env.reset(task="1/3 + 1/6?", answer="1/2")
    env.final_answer("1/2")
    print(json.dumps({
        "toolgym": toolgym.__file__, "prefix": sys.prefix, "user": env.isolation.user,
        "notes": env.isolation.notes, "looked": looked, "planted": planted,
        "wrong": wrong, "right": env.reward,
    }))
finally:
    env.close()
"""


def test_a_project_behind_a_private_folder_runs_without_opening_it(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret.txt").write_text("the answer is 1/2")
    (private / "venv").symlink_to(sys.prefix)  # the virtual environment, through it only
    source = private / "src"
    shutil.copytree(
        TOOLGYM_SOURCE, source / "toolgym", ignore=shutil.ignore_patterns("__pycache__")
    )
    write_lazy_grader(private / "envs")
    look = textwrap.dedent(
        f"""
        import os
        print("listed", sorted(os.listdir({str(private)!r})))  # the venv's mount point only
        for path in ({str(private / "secret.txt")!r}, {str(source)!r}):
            print(path, os.path.exists(path))
        """
    )
    known = [str(private / "envs"), str(source), str(private / "venv")]
    script = f"LOOK = {look!r}\nPLANT = {plant_code(known)!r}\n{HOST}"
    modes = {folder: folder.stat().st_mode for folder in (private, *private.parents)}
    done = subprocess.run(
        [str(private / "venv" / "bin" / "python"), "-c", script],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": f"{source}{os.pathsep}{private / 'envs'}",
            "HOME": str(tmp_path),
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["toolgym"].startswith(str(source))  # this host's toolgym is the private copy
    assert report["prefix"].startswith(str(private))  # and its venv is reached through it
    assert "(its own, from the pool" in report["user"], report
    assert not any("root" in note for note in report["notes"]), report["notes"]
    assert "listed ['venv']" in report["looked"], report["looked"]  # nothing beside it
    assert "secret.txt False" in report["looked"] and f"{source} False" in report["looked"]
    assert "planted ['" in report["planted"], report["planted"]
    assert report["wrong"] == 0.0, report["planted"]  # no planted module reached the grader
    assert report["right"] == 1.0
    after = {folder: folder.stat().st_mode for folder in (private, *private.parents)}
    assert after == modes  # no folder was opened
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert not (private / "envs" / "fractions.py").exists()
