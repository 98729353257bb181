#!/usr/bin/env bash
# A headless Chromium for the HTML report's browser tests (`make test` runs this; `make demo` never
# does). Uses the system's package manager where there is one; where there is none, or it fails,
# says so and exits 0: the browser tests then skip with a clear reason.
set -uo pipefail
for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then exit 0; fi
done
SUDO=""
if [ "${EUID:-0}" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi
if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null && exit 0
elif command -v dnf >/dev/null 2>&1; then
    $SUDO dnf install -y -q chromium && exit 0
elif command -v brew >/dev/null 2>&1; then
    brew install --cask -q chromium && exit 0
else
    echo "install-chromium: no package manager found (apt-get, dnf, brew); the browser tests will skip." >&2
    exit 0
fi
echo "install-chromium: could not install Chromium; the browser tests will skip." >&2
exit 0
