"""Run the chaos harness outside pytest: ``scripts/chaos.sh --help``."""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devkit.chaos import Chaos, ChaosSettings  # noqa: E402
from devkit.s3 import LocalS3, log_audit, with_hadoop_conf  # noqa: E402
from devkit.spark import local_session  # noqa: E402
from lakeprop import faults  # noqa: E402
from lakeprop.dev.localkafka import LocalKafka  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="how many times every fault point is armed (a round has one cycle per point)",
    )
    parser.add_argument("--random-kills", type=int, default=2, help="random kills per round")
    parser.add_argument(
        "--kill-everywhere",
        action="store_true",
        help="crash every fault point by SIGKILL of a spark-submit process (by default only "
        "the points inside an iteration are; the others raise in-process)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=0,
        help="the cluster mode: this many instances share the tables, and random ones are "
        "killed and paused past their session timeout (no fault points are armed)",
    )
    parser.add_argument(
        "--events", type=int, default=6, help="kills and pauses in the cluster mode, per round"
    )
    parser.add_argument(
        "--rolling",
        action="store_true",
        help="with --instances: restart the instances one by one instead (SIGTERM, then the "
        "same id again) as static members whose session timeout outlasts a restart, and "
        "count the slots that moved to another instance (there must be none)",
    )
    parser.add_argument(
        "--reslot",
        type=int,
        default=0,
        metavar="SLOTS",
        help="with --instances: then change the slot count to SLOTS as the docs say (stop "
        "every instance, start them with the new cluster.slots on a new cluster.topic), "
        "and go on with the events in the new era",
    )
    parser.add_argument(
        "--group-protocol",
        choices=["classic", "consumer"],
        default="classic",
        help="the membership group's protocol in the cluster mode (consumer: KIP-848)",
    )
    parser.add_argument(
        "--s3",
        action="store_true",
        help="keep the state, the checkpoint and the tables on a local S3 API server "
        "(S3Proxy) and check every Delta log on it for an overwritten or missing commit",
    )
    parser.add_argument("--workdir", help="keep state and cycle logs here (default: a temp dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lakeprop-chaos-"))
    settings = ChaosSettings(
        seed=args.seed,
        points=tuple(faults.POINTS) * args.rounds,
        random_kills=args.random_kills * args.rounds,
        kill_everywhere=args.kill_everywhere,
        instances=args.instances,
        cluster_events=args.events * args.rounds,
        rolling=args.rolling,
        reslot=args.reslot,
        group_protocol=args.group_protocol,
        session_timeout=120.0 if args.rolling else 6.0,
    )
    spark = local_session("lakeprop-chaos-checker")
    broker = LocalKafka(workdir / "kafka").start()
    s3 = LocalS3(workdir / "s3").start() if args.s3 else None
    try:
        if s3 is not None:
            with_hadoop_conf(spark, s3.hadoop_conf())
            settings = replace(
                settings,
                storage=s3.create_bucket("chaos") + "/run",
                spark_conf=s3.spark_conf(),
                audit=functools.partial(log_audit, s3),
            )
        report = Chaos(spark, workdir / "run", broker.bootstrap_servers, settings).run()
    finally:
        if s3 is not None:
            s3.stop()
        broker.stop()
        spark.stop()
    print(report.summary())
    print(f"state and cycle logs: {workdir}")
    moved = bool(report.slots_moved)
    return 0 if not report.differences and not report.points_missed and not moved else 1


if __name__ == "__main__":
    sys.exit(main())
