#!/usr/bin/env bash
# Make the sandbox backends available for the tests (idempotent; `make test` runs it):
# bubblewrap for the process backend, a Docker daemon, and the sandbox image (built offline
# with debootstrap, about a minute the first time).
#
# Installing needs root and apt-get. Where something cannot be set up, this says so and exits
# 0: the tests that need it skip with that reason, unless TOOLGYM_REQUIRE_SANDBOXES=1 (CI sets
# it), in which case they run and fail.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
say() { echo "sandbox set-up: $*"; }

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1; apt-get install -y -qq "${missing[@]}" >/dev/null; } \
            || say "could not install ${missing[*]}"
    else
        say "missing ${missing[*]} (install as root); the tests that need them will skip"
    fi
fi

# A root host runs each sandboxed worker (process backend) and container (docker) as a host
# uid of its own, from a pool (toolgym/sandbox/identities.py). The pool is the subordinate
# range /etc/subuid registers for the account toolgym-sandbox: registering it keeps useradd
# from handing the same uids to another account's containers. No folder of the user's is
# opened: a root host stages what workers read (toolgym/sandbox/scratch.py).
if [ "$(id -u)" = 0 ]; then
    if ! id toolgym-sandbox >/dev/null 2>&1 && command -v useradd >/dev/null; then
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            toolgym-sandbox && say "created the account toolgym-sandbox (it holds the workers' uid pool)"
    fi
    overlaps() {  # whether any range of /etc/subuid or /etc/subgid meets 200000-200999
        cat /etc/subuid /etc/subgid 2>/dev/null \
            | awk -F: 'NF == 3 && $2 <= 200999 && $2 + $3 > 200000 { found = 1 } END { exit !found }'
    }
    if id toolgym-sandbox >/dev/null 2>&1 && command -v usermod >/dev/null \
        && ! grep -qs '^toolgym-sandbox:' /etc/subuid && ! overlaps; then
        usermod --add-subuids 200000-200999 --add-subgids 200000-200999 toolgym-sandbox \
            && say "registered host uids 200000-200999 (/etc/subuid) for the sandbox's workers"
    fi
fi

if ! docker info >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
        say "starting dockerd"
        (nohup dockerd >"${TMPDIR:-/tmp}/toolgym-dockerd.log" 2>&1 &)
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    fi
fi
if ! docker info >/dev/null 2>&1; then
    say "no Docker daemon answers; the docker tests will skip"
    exit 0
fi
"$PY" -c "from toolgym.sandbox.docker import build_image; build_image(log=lambda m: print('sandbox set-up:', m))" \
    || say "building the sandbox image failed; the docker tests will skip"
exit 0
