"""Run the benchmark suite: ``python -m bench.run [NAME ...] [--size smoke|default|full]``.

Each benchmark runs lakeprop and its baseline side by side in this one process
(one Spark session, one local broker) and checks that both produced the same
tables. Figures are printed, and appended as data, one JSON record per figure,
to ``bench/results/<date>-<machine>.jsonl`` (:mod:`bench.results`; ``--no-record``
leaves them out, ``--results DIR`` writes elsewhere).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import functools  # noqa: E402

from bench import (  # noqa: E402
    auto_cdc,
    catchup,
    chain,
    failover,
    fairness,
    fanout,
    join,
    latency,
    many,
    membership,
    object_storage,
    pinned,
    recent,
    registration,
    results,
    rolling,
    scale,
    scale_out,
    small_tail,
    spark_jobs,
    throughput,
    vectors,
)
from bench.common import Result  # noqa: E402
from devkit.spark import local_session  # noqa: E402
from lakeprop.dev.localkafka import LocalKafka  # noqa: E402

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {
        "scale": {"jobs": 20, "ticks": 2, "notifications": 1},
        "registration": {"jobs": 20},
        "fanout": {"k": 2, "rows": 50, "commits": 1, "changes": 10},
        "catchup": {"rows": 1000, "repeats": 1, "replicas": 2},
        "recent": {"rows": 1000, "files": 2, "changes": 50, "repeats": 1},
        "latency": {"tick": 1, "commits": 2, "gap_ms": 500},
        "fairness": {"backlog": 3},
        "auto_cdc": {"keys": 2000, "batch": 200, "commits": 2},
        "small_tail": {"rows": 1000, "repeats": 1},
        "throughput": {"tables": 2, "window": 2, "max_rate": 1},
        "many": {"tables": 2, "k": 2, "trigger": 1, "settle": 1, "idle": 1, "trickle": 2},
        "auto_cdc_plain": {"keys": 2000, "batch": 200, "commits": 2},
        "auto_cdc_scd2": {"keys": 2000, "batch": 200, "commits": 2},
        "vectors": {"rows": 1000, "dim": 16, "queries": 10, "tail": 100, "executor_kmeans": 0},
        "membership": {"tables": 5000},
        "failover": {"tables": 3, "kills": 1},
        "scale_out": {"jobs": 50, "tables": 10},
        "pinned": {"tables": 2, "window": 2, "max_rate": 1},
        "object_storage": {"jobs": 10, "ticks": 2, "rows": 50, "repeats": 1},
        "rolling_restart": {"tables": 3, "session": 60},
        "chain": {"keys": 10, "groups": 3, "preload": 10, "trickle": 2},
        "spark_jobs": {"rows": 100, "changed": 2, "repeats": 1},
        "join": {"orders": 2000, "customers": 200, "commits": 2},
    },
    "default": {
        "scale": {"jobs": 1000, "ticks": 30},
        "registration": {"jobs": 1000},
        "fanout": {"k": 8, "rows": 5000, "commits": 5, "changes": 500, "warmup": 1},
        "catchup": {"rows": 200_000, "repeats": 3},
        "recent": {"rows": 2_000_000, "files": 40, "changes": 1000, "repeats": 3},
        "latency": {"tick": 1, "commits": 20, "gap_ms": 2000},
        "fairness": {"backlog": 200},
        "auto_cdc": {"keys": 1_000_000, "batch": 10_000, "commits": 5},
        "small_tail": {"rows": 1000, "repeats": 5},
        "throughput": {"tables": 100, "window": 15, "max_rate": 64},
        "many": {"tables": 50, "k": 4, "trigger": 5, "idle": 60, "trickle": 60},
        "auto_cdc_plain": {"keys": 1_000_000, "batch": 10_000, "commits": 5},
        "auto_cdc_scd2": {"keys": 1_000_000, "batch": 10_000, "commits": 5},
        "vectors": {"rows": 100_000, "dim": 128, "queries": 200, "tail": 10_000},
        "membership": {"tables": 100_000},
        "failover": {"tables": 12, "kills": 10},
        "scale_out": {"jobs": 20_000, "tables": 4_000},
        "pinned": {"tables": 24, "window": 15, "max_rate": 64},
        "object_storage": {"jobs": 1000, "ticks": 20, "rows": 1000, "repeats": 5},
        "rolling_restart": {"tables": 12, "session": 180},
        "chain": {"keys": 200, "groups": 10, "preload": 1000, "trickle": 60},
        "spark_jobs": {"rows": 1000, "changed": 10, "repeats": 3},
        "join": {"orders": 1_000_000, "customers": 100_000, "commits": 4},
    },
    "full": {
        "scale": {"jobs": 10_000, "ticks": 30},
        "registration": {"jobs": 10_000},
        "fanout": {"k": 8, "rows": 5000, "commits": 5, "changes": 500, "warmup": 1},
        "catchup": {"rows": 1_000_000, "repeats": 3},
        "recent": {"rows": 10_000_000, "files": 100, "changes": 1000, "repeats": 3},
        "latency": {"tick": 5, "commits": 20, "gap_ms": 2000},
        "fairness": {"backlog": 200},
        "auto_cdc": {"keys": 1_000_000, "batch": 10_000, "commits": 10},
        "small_tail": {"rows": 1000, "repeats": 9},
        "throughput": {"tables": 200, "window": 20, "max_rate": 128},
        "many": {"tables": 100, "k": 4, "trigger": 5, "idle": 120, "trickle": 120},
        "auto_cdc_plain": {"keys": 1_000_000, "batch": 10_000, "commits": 10},
        "auto_cdc_scd2": {"keys": 1_000_000, "batch": 10_000, "commits": 10},
        "vectors": {
            "rows": 1_000_000,
            "dim": 128,
            "queries": 200,
            "tail": 10_000,
            "executor_kmeans": 0,
        },
        "membership": {"tables": 100_000},
        "failover": {"tables": 12, "kills": 10},
        "scale_out": {"jobs": 20_000, "tables": 4_000},
        "pinned": {"tables": 48, "window": 20, "max_rate": 128},
        "object_storage": {"jobs": 1000, "ticks": 30, "rows": 1000, "repeats": 9},
        "rolling_restart": {"tables": 24, "session": 180},
        "chain": {"keys": 2000, "groups": 50, "preload": 100_000, "trickle": 120},
        "spark_jobs": {"rows": 100_000, "changed": 1000, "repeats": 5},
        "join": {"orders": 1_000_000, "customers": 100_000, "commits": 8},
    },
}

BENCHMARKS: dict[str, Callable[..., Result]] = {
    "scale": scale.run,
    "registration": registration.run,
    "fanout": fanout.run,
    "catchup": catchup.run,
    "recent": recent.run,
    "latency": latency.run,
    "fairness": fairness.run,
    "auto_cdc": auto_cdc.run,
    "small_tail": small_tail.run,
    "throughput": throughput.run,
    "many": many.run,
    "auto_cdc_plain": functools.partial(auto_cdc.run, diy_change_feed=0),
    "auto_cdc_scd2": functools.partial(auto_cdc.run, scd=2),
    "vectors": vectors.run,
    "membership": membership.run,
    "failover": failover.run,
    "scale_out": scale_out.run,
    "pinned": pinned.run,
    "object_storage": object_storage.run,
    "rolling_restart": rolling.run,
    "chain": chain.run,
    "spark_jobs": spark_jobs.run,
    "join": join.run,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"some of {sorted(BENCHMARKS)} (default: all)")
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME.PARAM=N",
        help="override one size, e.g. scale.jobs=3000",
    )
    parser.add_argument("--no-record", action="store_true", help="print the figures only")
    parser.add_argument(
        "--results", type=Path, default=results.RESULTS, help="where the results files go"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {sorted(BENCHMARKS)}")
    logging.basicConfig(level=logging.WARNING)
    sizes = {name: dict(params) for name, params in SIZES[args.size].items()}
    for item in args.set:
        target, _, value = item.partition("=")
        name, _, param = target.partition(".")
        sizes[name][param] = int(value)
    spark = local_session("lakeprop-bench")
    workdir = Path(tempfile.mkdtemp(prefix="lakeprop-bench-"))
    broker = LocalKafka(workdir / "kafka").start()
    context = results.run_context(spark, args.size, broker.classpath())
    target = results.results_file(args.results)
    failed = False
    try:
        for name in args.names or list(BENCHMARKS):
            result = BENCHMARKS[name](
                spark, workdir / name, broker.bootstrap_servers, **sizes[name]
            )
            print(result.show(), flush=True)
            if not args.no_record:
                results.append(result.records(context), target)
            failed |= not all(result.checks.values())
    finally:
        broker.stop()
        spark.stop()
    if not args.no_record:
        print(f"figures appended to {target}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
