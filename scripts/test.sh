#!/usr/bin/env bash
# The test command (.ci/run calls it). Two jobs, each on its own stack, set up
# by scripts/setup.sh (idempotent):
#
#   default  lint, type check, the docs (generated pages checked against the code,
#            mkdocs build --strict), then the whole suite, on the default stack;
#   floor    the unit tests and the integration tests marked `floor` (the engine,
#            the consumers, recovery, a chaos round) on the floor stack.
#
# With both, the floor job (its set-up, then its tests) runs beside the default one,
# its output kept in .cache/floor-job.log and shown when it ends: the suite keeps
# about 1.4 of two cores busy, and the floor's session fills the rest. The command
# fails when either job does.
#
# Each job runs its tests in one pytest run, the tests marked `processes` (each runs
# service processes of its own) last. With LAKEPROP_TEST_WORKERS=N (N > 1) it runs
# them in two parts: every test but those on N parallel workers (pytest-xdist: each
# has its own Spark session, broker and directories), then the `processes` tests
# one after another.
#
#   ./scripts/test.sh [--stack default|floor|all] [pytest arguments ...]
#
# The default is `all`: both jobs. Pytest arguments go to both.
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

run_default() {
  step "default: set-up" env LAKEPROP_STACK=default bash scripts/setup.sh
  local venv="${LAKEPROP_VENV:-$ROOT/$(venv_of default)}"
  step "default: lint" "$venv/bin/ruff" check src tests jobs scripts bench devkit
  step "default: format" "$venv/bin/ruff" format --check src tests jobs scripts bench devkit
  step "default: types" "$venv/bin/mypy"
  step "default: references" "$venv/bin/python" -m devkit.reference --check
  step "default: docs" env NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet
  tests default "$venv" "" "$@"
}

run_floor() {
  step "floor: set-up" env LAKEPROP_STACK=floor bash scripts/setup.sh
  tests floor "$ROOT/$(venv_of floor)" "unit or floor" "$@"
}

# job STACK ARGS...: one job, its time noted
job() {
  local stack="$1" started=$SECONDS
  shift
  echo "== test.sh: the $stack job" >&2
  "run_$stack" "$@"
  TIMES+=("$(printf '%-26s %5d s' "$stack: the job" $((SECONDS - started)))")
  echo "== test.sh: the $stack job passed in $((SECONDS - started)) s" >&2
}

FLOOR_JOB=""
floor_log="$ROOT/.cache/floor-job.log"
floor_times="$ROOT/.cache/floor-job.times"

# the floor job in the background: its output to floor_log, its step times to
# floor_times (a subshell's TIMES are its own)
floor_beside() {
  mkdir -p "$ROOT/.cache"
  rm -f "$floor_times"
  set -m  # a process group of its own: an interrupted run stops it whole
  (
    trap 'printf "%s\n" ${TIMES[@]+"${TIMES[@]}"} > "$floor_times"' EXIT
    TIMES=()
    job floor "$@"
  ) > "$floor_log" 2>&1 &
  FLOOR_JOB=$!
  set +m
}

# wait_floor: the floor job's end, its output and its times; false when it failed
wait_floor() {
  local rc=0
  wait "$FLOOR_JOB" || rc=$?
  FLOOR_JOB=""
  cat "$floor_log" >&2
  [ ! -f "$floor_times" ] || mapfile -t -O "${#TIMES[@]}" TIMES < "$floor_times"
  [ "$rc" -eq 0 ] || echo "== test.sh: the floor job failed (exit $rc)" >&2
  return "$rc"
}

summary() {
  local rc=$?
  # a floor job still running when the default job failed, or the run was
  # interrupted, is stopped (its pytest tears its services down) and waited for
  if [ -n "$FLOOR_JOB" ]; then
    [ "$rc" -eq 0 ] || kill -INT -- "-$FLOOR_JOB" 2>/dev/null || true
    wait_floor || true
  fi
  echo "== test.sh: where the time went" >&2
  printf '   %s\n' ${TIMES[@]+"${TIMES[@]}"} >&2
  return "$rc"
}
trap summary EXIT
trap 'exit 130' INT TERM

if [ "${#STACKS[@]}" -eq 2 ]; then
  floor_beside "$@"
  job default "$@"
  wait_floor
else
  job "${STACKS[0]}" "$@"
fi
