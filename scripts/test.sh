#!/usr/bin/env bash
# The test command (.ci/run calls it). Two jobs, each on its own stack, set up
# by scripts/setup.sh (idempotent):
#
#   default  lint, type check, the docs (generated pages checked against the code,
#            mkdocs build --strict), then the whole suite, on the default stack;
#   floor    the unit tests and the integration tests marked `floor` (the engine,
#            the consumers, recovery, a chaos round) on the floor stack.
#
#   ./scripts/test.sh [--stack default|floor|all] [pytest arguments ...]
#
# The default is `all`: both jobs, the floor only if the default one passed.
# Pytest arguments go to both.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STACKS=(default floor)
if [ "${1:-}" = "--stack" ]; then
  case "${2:-}" in
    default|floor) STACKS=("$2") ;;
    all) ;;
    *) echo "test.sh: --stack takes default, floor or all" >&2; exit 2 ;;
  esac
  shift 2
fi

venv_of() { python3 src/lakeprop/stack.py venv "$1"; }

run_default() {
  LAKEPROP_STACK=default bash scripts/setup.sh
  local venv="${LAKEPROP_VENV:-$ROOT/$(venv_of default)}"
  "$venv/bin/ruff" check src tests jobs scripts bench devkit
  "$venv/bin/ruff" format --check src tests jobs scripts bench devkit
  "$venv/bin/mypy"
  "$venv/bin/python" -m devkit.reference --check
  NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet
  LAKEPROP_STACK=default "$venv/bin/pytest" --durations=30 "$@"
}

run_floor() {
  LAKEPROP_STACK=floor bash scripts/setup.sh
  local venv="$ROOT/$(venv_of floor)"
  LAKEPROP_STACK=floor LAKEPROP_VENV="$venv" "$venv/bin/pytest" --durations=15 \
    -m "unit or floor" "$@"
}

for stack in "${STACKS[@]}"; do
  echo "== test.sh: the $stack job" >&2
  started=$SECONDS
  "run_$stack" "$@"
  echo "== test.sh: the $stack job passed in $((SECONDS - started)) s" >&2
done
