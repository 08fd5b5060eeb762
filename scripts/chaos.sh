#!/usr/bin/env bash
# The chaos harness: kill the service at every fault point and at random, restart it
# on the same checkpoint, and check that everything comes out exactly right.
#
#   scripts/chaos.sh                         # one round: every fault point once + 2 random kills
#   scripts/chaos.sh --rounds 30 --seed 7    # long mode: hundreds of cycles
#   scripts/chaos.sh --instances 3 --events 20   # three instances, killed and paused at random
#   scripts/chaos.sh --instances 3 --rolling --events 3   # a rolling restart: no slot may move
#   scripts/chaos.sh --s3 [--instances 3]    # the same with everything on a local S3 server
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec "${LAKEPROP_VENV:-$ROOT/.venv}/bin/python" scripts/chaos.py "$@"
