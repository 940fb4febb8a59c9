#!/usr/bin/env bash
# Installs everything cookmind needs into ./.venv on a fresh machine.
# torch is pinned first: 2.13.0 is the CPU build on this machine's disk; a looser requirement
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
# The web-page test drives Debian's Chromium through Playwright; install it when we can.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "install.sh: could not install chromium; the browser test will be skipped"
  else
    echo "install.sh: chromium not found; the browser test will be skipped (apt-get install chromium)"
  fi
fi
echo "cookmind installed: .venv/bin/cookmind --help"
