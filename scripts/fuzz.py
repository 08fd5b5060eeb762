"""Run the operation fuzzer outside pytest: ``scripts/fuzz.sh --help``."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devkit.fuzzing.joins import run_joins  # noqa: E402
from devkit.fuzzing.runner import WORKLOADS, Fuzzer, shrink  # noqa: E402
from devkit.spark import local_session  # noqa: E402
from lakeprop.dev.localkafka import LocalKafka  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds, from --first")
    parser.add_argument("--operations", type=int, default=12, help="operations per sequence")
    parser.add_argument(
        "--minutes", type=float, default=0.0, help="stop starting new seeds after this long"
    )
    parser.add_argument(
        "--shrink-minutes", type=float, default=20.0, help="time to shrink a failing sequence"
    )
    parser.add_argument(
        "--workload",
        choices=(*WORKLOADS, "joins"),
        default="consumers",
        help="every consumer on one source, random chains of table consumers, both, or "
        "a join view with random operations on each of its tables",
    )
    parser.add_argument("--tables", type=int, choices=(2, 3), default=2, help="joins: how many")
    parser.add_argument("--workdir", help="where the tables go (default: a temp dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every sequence")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lakeprop-fuzz-"))
    spark = local_session("lakeprop-fuzz")
    if args.workload == "joins":
        return joins(spark, workdir, args)
    broker = LocalKafka(workdir / "kafka").start()
    started = time.monotonic()
    clean, failed = [], []
    try:
        fuzzer = Fuzzer(spark, workdir, broker.bootstrap_servers, args.workload)
        for seed in range(args.first, args.first + args.seeds):
            if args.minutes and time.monotonic() - started > args.minutes * 60:
                break
            case = fuzzer.generate(seed, args.operations)
            began = time.monotonic()
            problem = fuzzer.check(case)
            took = time.monotonic() - began
            if problem is None:
                clean.append(seed)
                print(f"seed {seed}: clean ({len(case.steps)} operations, {took:.0f}s)", flush=True)
                if args.verbose:
                    print(case.describe(), flush=True)
                continue
            print(f"seed {seed}: FAILED ({took:.0f}s): {problem}", flush=True)
            small = shrink(case, lambda c: fuzzer.check(c) is not None, args.shrink_minutes * 60)
            print(small.describe(), f"\n  fails: {fuzzer.check(small) or problem}", flush=True)
            failed.append(seed)
        tails = ", ".join(
            f"{fleet} {path} {n}" for (fleet, path), n in sorted(fuzzer.paths.items())
        )
        print(f"tails per fleet and path: {tails or 'none'}")
    finally:
        broker.stop()
        spark.stop()
    print(
        f"{len(clean)} sequence(s) clean, {len(failed)} failed {failed}; seeds "
        f"{args.first}..{args.first + len(clean) + len(failed) - 1}, "
        f"{time.monotonic() - started:.0f}s"
    )
    return 1 if failed else 0


def joins(spark: Any, workdir: Path, args: argparse.Namespace) -> int:
    """The join workload (:mod:`devkit.fuzzing.joins`): each seed alone, no shrinking
    (its operations and first difference are printed)."""
    started = time.monotonic()
    failed = []
    seeds = range(args.first, args.first + args.seeds)
    try:
        for seed in seeds:
            if args.minutes and time.monotonic() - started > args.minutes * 60:
                break
            began = time.monotonic()
            problem = run_joins(spark, workdir, [seed], args.operations, args.tables)
            took = time.monotonic() - began
            if problem:
                failed.append(seed)
                print(f"seed {seed}: FAILED ({took:.0f}s): {problem[0][1]}", flush=True)
            else:
                print(f"seed {seed}: clean ({args.operations} operations, {took:.0f}s)", flush=True)
    finally:
        spark.stop()
    print(f"{len(failed)} failed {failed}; {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
