#!/usr/bin/env bash
# Run the propagation service through spark-submit.
#
#   ./spark-submit.sh
#       Local: sets up the project (idempotent), starts the embedded Kafka broker,
#       runs on local[2] with conf/local.toml until Ctrl-C, then stops cleanly.
#
#   ./spark-submit.sh --master yarn --deploy-mode cluster --config conf/cluster.toml \
#       [--conf spark.x=y ...] [--set section.key=value ...]
#       Cluster: ships the library as a wheel (--py-files), the config with --files,
#       and Delta + the Kafka connector by Maven coordinates (--packages, chosen for the
#       installed PySpark by lakeprop.stack), or, with --jars-dir DIR, the jars in DIR
#       (pre-fetched: no Ivy resolution at submit; `scripts/setup.sh` leaves them in
#       .cache/jars). Either way lakeprop's Delta log store for S3 travels with
#       --jars (it is built by setup, not on Maven Central): with it in
#       spark.delta.logStore.s3a.impl (conf/cluster.toml) commits on S3 exclude every
#       other writer (docs: operations/object-storage).
#
#   LAKEPROP_STACK=floor runs on the floor stack (.venv-floor and its jars).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

CONFIG=""
SETS=()
SUBMIT=()
MASTER=""
DEPLOY_MODE="client"
JARS_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG="$2"; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --master) MASTER="$2"; SUBMIT+=("$1" "$2"); shift 2 ;;
    --deploy-mode) DEPLOY_MODE="$2"; SUBMIT+=("$1" "$2"); shift 2 ;;
    --jars-dir) JARS_DIR="$2"; shift 2 ;;
    *) SUBMIT+=("$1"); shift ;;
  esac
done

# set-up is idempotent and quick; a caller that has done it (the tests, whose services
# start by the dozen) says so, and no two starts ever install beside each other
[ -n "${LAKEPROP_SET_UP:-}" ] || bash scripts/setup.sh
STACK="${LAKEPROP_STACK:-default}"
VENV="${LAKEPROP_VENV:-$ROOT/$(python3 src/lakeprop/stack.py venv "$STACK")}"
STACK_JARS="$ROOT/$(python3 src/lakeprop/stack.py jars "$STACK")"
export PYSPARK_PYTHON="$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
PACKAGES="$("$VENV/bin/python" -m lakeprop.stack packages)"

if [ -z "$MASTER" ] || [[ "$MASTER" == local* ]]; then
  # Local: the stack's jars (resolved by setup), no network needed.
  CONFIG="${CONFIG:-conf/local.toml}"
  [ -n "$MASTER" ] || SUBMIT+=(--master "local[2]")
  JARS="$(ls "$STACK_JARS"/*.jar | paste -sd, -)"
  SUBMIT+=(--jars "$JARS" --driver-memory 2g)
  APP_ARGS=(--config "$CONFIG")
else
  [ -n "$CONFIG" ] || { echo "spark-submit.sh: --config is required with a cluster master" >&2; exit 1; }
  [ -f "$CONFIG" ] || { echo "spark-submit.sh: config file $CONFIG does not exist" >&2; exit 1; }
  # The wheel and its one pure-Python dependency (metrics) travel as --py-files.
  rm -rf dist && "$VENV/bin/pip" wheel -q --no-deps -w dist . "prometheus-client==0.26.0"
  PY_FILES="$(ls dist/*.whl | paste -sd, -)"
  LOGSTORE_JAR="$ROOT/.cache/build/logstore/lakeprop-logstore-1.0.0.jar"
  if [ -n "$JARS_DIR" ]; then
    JARS="$(ls "$JARS_DIR"/*.jar 2>/dev/null | paste -sd, -)"
    [ -n "$JARS" ] || { echo "spark-submit.sh: no jars in $JARS_DIR" >&2; exit 1; }
    [ -f "$JARS_DIR/$(basename "$LOGSTORE_JAR")" ] || JARS="$JARS,$LOGSTORE_JAR"
    SUBMIT+=(--jars "$JARS")
  else
    SUBMIT+=(--packages "$PACKAGES" --jars "$LOGSTORE_JAR")
  fi
  SUBMIT+=(--py-files "$PY_FILES" --files "$CONFIG")
  if [ "$DEPLOY_MODE" = "cluster" ]; then
    # the driver runs in a container whose working directory holds the --files
    APP_ARGS=(--config "$(basename "$CONFIG")")
  else
    # client mode: the driver runs here, where the file is
    APP_ARGS=(--config "$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")")
  fi
fi

# spark-submit runs in its own session so that Ctrl-C reaches only this script,
# which asks the Python driver to stop the query (SIGTERM) and waits for it.
setsid "$VENV/bin/spark-submit" "${SUBMIT[@]}" jobs/propagate.py "${APP_ARGS[@]}" "${SETS[@]}" &
SUBMIT_PID=$!
stop() {
  trap - INT TERM
  echo "spark-submit.sh: stopping (waiting for the current micro-batch)" >&2
  local drivers
  drivers="$(pgrep -P "$SUBMIT_PID" -f propagate.py || true)"
  if [ -n "$drivers" ]; then kill -TERM $drivers 2>/dev/null || true; else kill -TERM "$SUBMIT_PID" 2>/dev/null || true; fi
  for _ in $(seq 1 120); do kill -0 "$SUBMIT_PID" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$SUBMIT_PID" 2>/dev/null || true
}
trap stop INT TERM
set +e
wait "$SUBMIT_PID"
status=$?
# wait returns early (128 + the signal) when a trapped signal arrives: wait again
# for spark-submit's own exit status (bash keeps it once the process has ended).
while [ "$status" -gt 128 ]; do
  wait "$SUBMIT_PID"
  status=$?
  kill -0 "$SUBMIT_PID" 2>/dev/null || break
done
exit "$status"
