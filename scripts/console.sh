#!/usr/bin/env bash
# Install what is needed and open the loadmaster console on this machine (no config needed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The lab extra: the node tools plus SeaweedFS, so `loadmaster lab up` works from here too.
bash "$ROOT/scripts/bootstrap.sh" lab
exec "$ROOT/.venv/bin/loadmaster" "$@"
