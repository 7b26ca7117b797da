#!/usr/bin/env bash
# Make headless Chromium available for the run viewer's browser tests (idempotent; cheap when
# it is already there). Debian's `chromium` package: nothing is downloaded from elsewhere.
#
# Installing needs root and apt-get. Where it cannot be installed, this says so and exits 0:
# the browser tests skip with that reason, unless TOOLGYM_REQUIRE_BROWSER=1 (CI sets it), in
# which case they run and fail.
set -uo pipefail
say() { echo "browser set-up: $*"; }

for binary in chromium chromium-browser; do
    if command -v "$binary" >/dev/null; then
        exit 0
    fi
done

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "chromium is missing (install the Debian package chromium as root); the browser tests will skip"
    exit 0
fi

say "installing chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 \
        && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
    || say "could not install chromium; the browser tests will skip"
command -v chromium >/dev/null && say "$(chromium --version 2>/dev/null)"
exit 0
