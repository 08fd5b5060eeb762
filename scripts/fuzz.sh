#!/usr/bin/env bash
# The operation fuzzer: random sequences of real Delta operations on a source table
# (inserts, updates that keep or change the key, deletes (of single rows and of
# whole files, which removes a file with a deletion vector), MERGE, overwrites,
# replaceWhere, truncates, RESTORE, OPTIMIZE, added columns, re-created tables) with
# random properties (deletion vectors, column mapping, partitioning), every consumer
# on both paths, every target compared whole with its model. With --workload
# pipelines (or all): random chains of two or three table consumers (replica,
# auto_cdc, aggregate_view, secondary_index) with random drop rules, one on each
# path, every step compared whole with the model of the chain up to it.
#
#   scripts/fuzz.sh --seeds 20                  # seeds 1..20, 12 operations each
#   scripts/fuzz.sh --seeds 20 --workload pipelines
#   scripts/fuzz.sh --first 500 --seeds 100 --operations 20 --minutes 60
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec "${LAKEPROP_VENV:-$ROOT/.venv}/bin/python" scripts/fuzz.py "$@"
