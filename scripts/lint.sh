#!/usr/bin/env bash
# The static checks CI enforces, in the order that fails fastest: ruff lint, ruff format,
# import-linter (the layer contracts in pyproject.toml), mypy. Run by scripts/test.sh before the
# suite; run it alone while working: bash scripts/lint.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="$ROOT/.venv/bin"
step() { echo "lint: $*" >&2; }
step "ruff check"
"$BIN/ruff" check --quiet .
step "ruff format --check"
"$BIN/ruff" format --check --quiet .
step "lint-imports"
"$BIN/lint-imports" --no-cache >/dev/null || "$BIN/lint-imports" --no-cache
step "mypy"
"$BIN/mypy" --no-error-summary --cache-dir "${MYPY_CACHE_DIR:-.mypy_cache}"
step "ok"
