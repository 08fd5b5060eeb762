#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: the virtual environment with the pinned
# packages of one stack, the JVM jars Spark needs (Delta, the Kafka connector, S3A
# and lakeprop's S3 log store) and the classpaths of the local Kafka broker and the
# local S3 API server. Every step is skipped when its inputs have
# not changed, so calling this before every run costs a second.
#
#   scripts/setup.sh                       the default stack: .venv, .cache/jars
#   LAKEPROP_STACK=floor scripts/setup.sh  the floor stack:   .venv-floor, .cache/floor/jars
#
# The stacks, and the jars each implies, are defined in src/lakeprop/stack.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
STACK="${LAKEPROP_STACK:-default}"
MVN=(mvn -q -B -s "$ROOT/tools/maven-settings.xml")

log() { printf '[setup:%s] %s\n' "$STACK" "$*" >&2; }

for tool in "$PYTHON" java mvn; do
  command -v "$tool" >/dev/null || { echo "setup: '$tool' is required but not on PATH" >&2; exit 1; }
done

stack() { "$PYTHON" "$ROOT/src/lakeprop/stack.py" "$@"; }
VENV="${LAKEPROP_VENV:-$ROOT/$(stack venv "$STACK")}"
JARS="$ROOT/$(stack jars "$STACK")"
CACHE="$ROOT/.cache"
STAMPS="$CACHE/stamps/$STACK"

# stamp NAME FILE...: true when the stamp for NAME matches the files' content.
stamp_ok() {
  local name="$1"; shift
  [ -f "$STAMPS/$name" ] && [ "$(cat "$@" | sha256sum)" = "$(cat "$STAMPS/$name")" ]
}
stamp_write() {
  local name="$1"; shift
  mkdir -p "$STAMPS"
  cat "$@" | sha256sum > "$STAMPS/$name"
}

# 1. Python environment: the project with its dev tools and the stack's pins.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
fi
mkdir -p "$STAMPS"
stack constraints "$STACK" > "$STAMPS/constraints.txt"
if ! stamp_ok venv "$ROOT/pyproject.toml" "$STAMPS/constraints.txt"; then
  log "installing Python packages ($(paste -sd' ' "$STAMPS/constraints.txt"), ...)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -c "$STAMPS/constraints.txt" -e "$ROOT[dev,spark]"
  stamp_write venv "$ROOT/pyproject.toml" "$STAMPS/constraints.txt"
fi

# 2. Jars for Spark: Delta and the Kafka connector for the installed PySpark, minus
# what PySpark ships. They depend on the pom and the installed versions, not on the
# rest of pyproject.toml: an unrelated edit there must not delete them from under a
# running service.
properties=$("$VENV/bin/python" -m lakeprop.stack maven-properties)
if ! stamp_ok jars "$ROOT/tools/spark/pom.xml" <(echo "$properties") || [ ! -d "$JARS" ]; then
  log "resolving Spark packages from Maven Central ($properties)"
  rm -rf "$JARS" "$JARS-all"
  # shellcheck disable=SC2086 # the properties are words on purpose
  "${MVN[@]}" -f "$ROOT/tools/spark/pom.xml" $properties dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$JARS-all"
  "$VENV/bin/python" "$ROOT/scripts/select_jars.py" "$JARS-all" "$JARS"
  rm -rf "$JARS-all"
  stamp_write jars "$ROOT/tools/spark/pom.xml" <(echo "$properties")
fi

# 3-5 are shared by every stack, and so are their stamps: one set-up at a time makes
# them (the test command sets the floor stack up beside the default one, whose tests
# may be reading them already), the other then finds them made and leaves them alone.
mkdir -p "$CACHE"
exec 9> "$CACHE/shared.lock"
flock 9
STAMPS="$CACHE/stamps/shared"

# 3. The local Kafka broker (KRaft) classpath, shared by every stack.
broker=$(stack broker "$STACK")
if ! stamp_ok kafka "$ROOT/tools/kafka/pom.xml" <(echo "$broker") || [ ! -s "$CACHE/kafka.classpath" ]; then
  log "resolving the Apache Kafka $broker broker from Maven Central"
  "${MVN[@]}" -f "$ROOT/tools/kafka/pom.xml" -Dkafka.version="$broker" dependency:build-classpath \
    -Dmdep.outputFile="$CACHE/kafka.classpath"
  stamp_write kafka "$ROOT/tools/kafka/pom.xml" <(echo "$broker")
fi

# 4. lakeprop's Delta log store for S3 (tools/logstore), built once for every stack
# (it is compiled against the oldest Hadoop and Delta supported) and put beside the
# stack's jars, so local sessions commit to s3a:// exclusively.
logstore_sources=("$ROOT/tools/logstore/pom.xml" $(find "$ROOT/tools/logstore/src" -name '*.java' | sort))
logstore_jar="$CACHE/build/logstore/lakeprop-logstore-1.0.0.jar"
if ! stamp_ok logstore "${logstore_sources[@]}" || [ ! -s "$logstore_jar" ]; then
  log "building the S3 log store (tools/logstore)"
  "${MVN[@]}" -f "$ROOT/tools/logstore/pom.xml" package
  stamp_write logstore "${logstore_sources[@]}"
fi
cmp -s "$logstore_jar" "$JARS/$(basename "$logstore_jar")" || cp "$logstore_jar" "$JARS/"

# 5. The local S3 API server (S3Proxy) classpath, shared by every stack.
if ! stamp_ok s3proxy "$ROOT/tools/s3proxy/pom.xml" || [ ! -s "$CACHE/s3proxy.classpath" ]; then
  log "resolving the S3Proxy server from Maven Central"
  "${MVN[@]}" -f "$ROOT/tools/s3proxy/pom.xml" dependency:build-classpath \
    -Dmdep.outputFile="$CACHE/s3proxy.classpath"
  stamp_write s3proxy "$ROOT/tools/s3proxy/pom.xml"
fi

flock -u 9

log "ready: $VENV, $JARS, $CACHE/kafka.classpath, $CACHE/s3proxy.classpath"
