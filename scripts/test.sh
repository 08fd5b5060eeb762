#!/usr/bin/env bash
# The test command: set-up (idempotent), lint, type check, then the whole suite
# against a real Kafka broker, Spark and Delta. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
VENV="${LAKEPROP_VENV:-$ROOT/.venv}"
"$VENV/bin/ruff" check src tests jobs scripts bench
"$VENV/bin/ruff" format --check src tests jobs scripts bench
"$VENV/bin/mypy"
exec "$VENV/bin/pytest" --durations=30 "$@"
