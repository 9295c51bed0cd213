#!/usr/bin/env bash
# Install what is needed and open the loadmaster console on this machine (no config needed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" node
exec "$ROOT/.venv/bin/loadmaster" "$@"
