#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: the virtual environment with the pinned
# packages, the JVM jars Spark needs (Delta, Kafka connector) and the classpath of
# the local Kafka broker. Every step is skipped when its inputs have not changed,
# so calling this before every run costs a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LAKEPROP_VENV:-$ROOT/.venv}"
CACHE="$ROOT/.cache"
PYTHON="${PYTHON:-python3}"
MVN=(mvn -q -B -s "$ROOT/tools/maven-settings.xml")

log() { printf '[setup] %s\n' "$*" >&2; }

# stamp NAME FILE...: true when the stamp for NAME matches the files' content.
stamp_ok() {
  local name="$1"; shift
  [ -f "$CACHE/stamps/$name" ] && [ "$(cat "$@" | sha256sum)" = "$(cat "$CACHE/stamps/$name")" ]
}
stamp_write() {
  local name="$1"; shift
  mkdir -p "$CACHE/stamps"
  cat "$@" | sha256sum > "$CACHE/stamps/$name"
}

for tool in "$PYTHON" java mvn; do
  command -v "$tool" >/dev/null || { echo "setup: '$tool' is required but not on PATH" >&2; exit 1; }
done

# 1. Python environment.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if ! stamp_ok venv "$ROOT/pyproject.toml"; then
  log "installing Python packages (pyspark, delta-spark, confluent-kafka, ...)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e "$ROOT[dev]"
  stamp_write venv "$ROOT/pyproject.toml"
fi

# 2. Jars for Spark: Delta and the Kafka connector, minus what PySpark ships. They
# depend on the pom and on the PySpark installed, not on the rest of pyproject.toml:
# an unrelated edit there must not delete them from under a running service.
pyspark_version=$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')
if ! stamp_ok jars "$ROOT/tools/spark/pom.xml" <(echo "$pyspark_version") || [ ! -d "$CACHE/jars" ]; then
  log "resolving Spark packages from Maven Central (first run downloads ~60 MB)"
  rm -rf "$CACHE/jars" "$CACHE/jars-all"
  "${MVN[@]}" -f "$ROOT/tools/spark/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$CACHE/jars-all"
  "$VENV/bin/python" "$ROOT/scripts/select_jars.py" "$CACHE/jars-all" "$CACHE/jars"
  rm -rf "$CACHE/jars-all"
  stamp_write jars "$ROOT/tools/spark/pom.xml" <(echo "$pyspark_version")
fi

# 3. The local Kafka broker (KRaft) classpath.
if ! stamp_ok kafka "$ROOT/tools/kafka/pom.xml" || [ ! -s "$CACHE/kafka.classpath" ]; then
  log "resolving the Apache Kafka broker from Maven Central"
  "${MVN[@]}" -f "$ROOT/tools/kafka/pom.xml" dependency:build-classpath \
    -Dmdep.outputFile="$CACHE/kafka.classpath"
  stamp_write kafka "$ROOT/tools/kafka/pom.xml"
fi

log "ready: $VENV, $CACHE/jars, $CACHE/kafka.classpath"
