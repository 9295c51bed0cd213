#!/usr/bin/env bash
# Creates ./.venv with loadmaster and what it needs. Sourced by scripts/console.sh and
# scripts/test.sh; safe to run again (it only installs what is missing or changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
EXTRAS="${1:-}"

apt_install() {
  # Debian packages, only when missing; needs root (or sudo) on a fresh machine.
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "bootstrap: installing Debian packages: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  echo "bootstrap: loadmaster needs Python >= 3.11 as '$PY' (set PYTHON=...)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv 2>/dev/null || { apt_install python3-venv; rm -rf .venv; "$PY" -m venv .venv; }
fi
STAMP=".venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)${EXTRAS:+-$EXTRAS}"
if [ ! -f "$STAMP" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # constraints.txt pins torch to the CPU build (an open range would pull a multi-GB CUDA build).
  .venv/bin/python -m pip install -q -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
  touch "$STAMP"
fi
