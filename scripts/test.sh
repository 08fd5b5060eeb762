#!/usr/bin/env bash
# The test command (.ci/run calls it). Two jobs, each on its own stack, set up
# by scripts/setup.sh (idempotent; the floor's set-up runs beside the default job's):
#
#   default  lint, type check, the docs (generated pages checked against the code,
#            mkdocs build --strict), then the whole suite but the benchmarks' smoke
#            runs (marker `bench`, `make bench-smoke`), on the default stack;
#   floor    the unit tests and the integration tests marked `floor` (the engine,
#            the consumers, recovery, a chaos round) on the floor stack.
#
# Each job runs its tests in one pytest run, the tests marked `processes` (each runs
# service processes of its own) last. With LAKEPROP_TEST_WORKERS=N (N > 1) it runs
# them in two parts: every test but those on N parallel workers (pytest-xdist: each
# has its own Spark session, broker and directories), then the `processes` tests
# one after another.
#
#   ./scripts/test.sh [--stack default|floor|all] [pytest arguments ...]
#
# The default is `all`: both jobs, the floor only if the default one passed.
# Pytest arguments go to both.
# At the end it prints where the time went (every step of each job); each pytest
# run prints its own summary (per module, the slowest tests), see devkit/timing.py.
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

# One worker by default: the suite is CPU-bound, and two workers on two cores ran it
# slower than one (each worker's session competes for the same cores)
WORKERS="${LAKEPROP_TEST_WORKERS:-1}"
TIMES=()

venv_of() { python3 src/lakeprop/stack.py venv "$1"; }

# step NAME COMMAND...: run it, and note how long it took
step() {
  local name="$1" started=$SECONDS
  shift
  "$@"
  TIMES+=("$(printf '%-26s %5d s' "$name" $((SECONDS - started)))")
}

# pytest_part STACK VENV ARGS...: pytest on the stack, where selecting no test at all
# (exit code 5: a part the arguments given leave empty) is no failure of the part;
# RAN counts the parts that ran tests
RAN=0
pytest_part() {
  local stack="$1" venv="$2" rc=0
  shift 2
  LAKEPROP_STACK="$stack" LAKEPROP_VENV="$venv" "$venv/bin/pytest" "$@" || rc=$?
  [ "$rc" -ne 0 ] || RAN=$((RAN + 1))
  [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ]
}

# tests STACK VENV SELECTION ARGS...: both parts of a job's tests; SELECTION is a
# marker expression ("" for every test), and a -m among ARGS narrows it further
# (pytest keeps only the last -m it is given, so the parts' own are joined to it)
tests() {
  local stack="$1" venv="$2" only="${3:+($3) and }" args=()
  shift 3
  while [ $# -gt 0 ]; do
    case "$1" in
      -m) only="${only}(${2:?-m takes a marker expression}) and "; shift 2 ;;
      -m*) only="${only}(${1#-m}) and "; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  local before=$RAN
  if [ "$WORKERS" -le 1 ]; then  # one run, the `processes` tests last (conftest's order)
    step "$stack: pytest" \
      pytest_part "$stack" "$venv" ${only:+-m "${only% and }"} ${args[@]+"${args[@]}"}
  else
  step "$stack: pytest, parallel" \
    pytest_part "$stack" "$venv" -n "$WORKERS" -m "${only}not processes" ${args[@]+"${args[@]}"}
  step "$stack: pytest, processes" \
    pytest_part "$stack" "$venv" -m "${only}processes" ${args[@]+"${args[@]}"}
  fi
  if [ "$RAN" -eq "$before" ]; then
    echo "test.sh: the $stack job selected no test at all" >&2
    return 1
  fi
}

FLOOR_SETUP=""
floor_setup_log="$ROOT/.cache/setup-floor.log"

run_default() {
  if [[ " ${STACKS[*]} " == *" floor "* ]]; then  # the floor's set-up, beside this job's
    mkdir -p "$ROOT/.cache"
    (LAKEPROP_STACK=floor bash scripts/setup.sh > "$floor_setup_log" 2>&1) &
    FLOOR_SETUP=$!
  fi
  step "default: set-up" env LAKEPROP_STACK=default bash scripts/setup.sh
  local venv="${LAKEPROP_VENV:-$ROOT/$(venv_of default)}"
  step "default: lint" "$venv/bin/ruff" check src tests jobs scripts bench devkit
  step "default: format" "$venv/bin/ruff" format --check src tests jobs scripts bench devkit
  step "default: types" "$venv/bin/mypy"
  step "default: references" "$venv/bin/python" -m devkit.reference --check
  step "default: docs" env NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet
  tests default "$venv" "not bench" "$@"
}

run_floor() {
  local started=$SECONDS
  if [ -n "$FLOOR_SETUP" ]; then
    wait "$FLOOR_SETUP" || { cat "$floor_setup_log" >&2; return 1; }
    cat "$floor_setup_log" >&2
  else
    LAKEPROP_STACK=floor bash scripts/setup.sh
  fi
  TIMES+=("$(printf '%-26s %5d s' "floor: set-up (wait)" $((SECONDS - started)))")
  tests floor "$ROOT/$(venv_of floor)" "unit or floor" "$@"
}

summary() {
  # a floor set-up still running (the default job failed) is waited for, not orphaned
  [ -z "$FLOOR_SETUP" ] || wait "$FLOOR_SETUP" 2>/dev/null || true
  echo "== test.sh: where the time went" >&2
  printf '   %s\n' ${TIMES[@]+"${TIMES[@]}"} >&2
}
trap summary EXIT

for stack in "${STACKS[@]}"; do
  echo "== test.sh: the $stack job" >&2
  started=$SECONDS
  "run_$stack" "$@"
  TIMES+=("$(printf '%-26s %5d s' "$stack: the job" $((SECONDS - started)))")
  echo "== test.sh: the $stack job passed in $((SECONDS - started)) s" >&2
done
