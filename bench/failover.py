"""Failover: from a SIGKILL of an instance to the first iteration of a table it served.

Three instances (``spark-submit.sh``, a local master of one core each) share
`tables` tables, one greedy replica job each, with a membership session timeout
of `session` seconds. Each round SIGKILLs the instance serving the most
tables, commits to one of them at once, and waits for the iteration another
instance starts on it: from the kill to that iteration's start is the failover
time (the session timeout, for the coordinator to drop the member, then the
next tick and the takeover). The victim restarts and the group settles before the next
round; at the end every replica must equal its source. There is no baseline:
with one instance, the equivalent is a restart.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Figure, Result, app_config, percentile, same_rows, sources
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.instances import Instance, settled, stopped_at_exit
from devkit.waiting import assert_eventually
from lakeprop.client.api import LakepropClient, TableWatch
from lakeprop.client.scans import SparkScan
from lakeprop.config import AppConfig, ClusterConfig
from lakeprop.membership.members import Member
from lakeprop.spec import JobKey
from lakeprop.state.store import HISTORY_TABLE

TITLE = "failover"
INSTANCES = 3


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    tables: int = 12,
    kills: int = 10,
    session: int = 6,
    **_: Any,
) -> Result:
    result = Result(TITLE, {"tables": tables, "kills": kills, "session_s": session})
    side, paths = Fleet.with_replicas(spark, workdir, bootstrap, tables, session)
    config, cluster, names = side.config, side.cluster, side.names
    started = {f"i{n}": Instance(f"i{n}", config, workdir, cluster).start() for n in range(3)}
    times: list[float] = []
    next_id = iter(range(1, 1_000_000))
    with stopped_at_exit(started) as running:
        side.settled(set(running))
        side.served(time.time() - 3600, {t for _, t in names})
        for round_ in range(kills):
            group = side.settled(set(running))
            victim = max(group, key=lambda m: (len(group[m].tables), m == f"i{round_ % 3}"))
            moved = sorted(t.split(".", 1)[1] for t in group[victim].tables)
            killed_at = time.time()
            running[victim].kill()
            # a commit the dead instance cannot have served: the next owner must
            add_row(spark, f"{config.tables.warehouse}/db/{moved[0]}", next(next_id))
            times.append(side.served(killed_at, {moved[0]}, not_by=victim) - killed_at)
            running[victim] = Instance(victim, config, workdir, cluster).start()
        side.settled(set(running))
        for path in paths:  # the last commits are in every replica
            side.reached(path)
    p50, p95, worst = percentile(times, 0.5), percentile(times, 0.95), max(times)
    result.figures += [
        Figure("kill to first iteration of a moved table, p50", "s", round(p50, 2)),
        Figure("kill to first iteration of a moved table, p95", "s", round(p95, 2)),
        Figure("kill to first iteration of a moved table, max", "s", round(worst, 2)),
        Figure("session timeout", "s", session),
    ]
    result.checks["every replica equals its source"] = all(
        same_rows(spark.read.format("delta").load(p), spark.read.format("delta").load(f"{p}_copy"))
        for p in paths
    )
    result.checks["every kill's tables served within the session timeout plus 30 s"] = all(
        t <= session + 30 for t in times
    )
    return result


def add_row(spark: SparkSession, path: str, row_id: int) -> None:
    spark.createDataFrame([(row_id, f"n{row_id}", float(row_id))], SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)


class Fleet:
    """What the benchmark reads of the group and of the iteration history."""

    def __init__(
        self,
        spark: SparkSession,
        config: AppConfig,
        cluster: ClusterConfig,
        names: list[tuple[str, str]],
    ) -> None:
        self.spark = spark
        self.config = config
        self.cluster = cluster
        self.names = names
        self.history = config.state.table_path(HISTORY_TABLE)
        self.watch = TableWatch(SparkScan(spark), self.history)

    @classmethod
    def with_replicas(
        cls,
        spark: SparkSession,
        workdir: Path,
        bootstrap: str,
        tables: int,
        session: int,
        static: bool = False,
    ) -> tuple[Fleet, list[str]]:
        """A fleet's set-up: ``tables`` one-row sources ``db.t<i>``, one greedy replica
        job each (``<source>_copy``), twelve slots and a ``session`` s session timeout;
        the fleet and the sources' paths."""
        config = app_config(workdir, bootstrap)
        cluster = ClusterConfig(
            enabled=True,
            topic=f"{config.kafka.topic}.members",
            slots=12,
            session_timeout=float(session),
            heartbeat_interval=1.0,
            static_membership=static,
        )
        paths = sources(spark, Path(config.tables.warehouse), tables)
        names = [("db", f"t{i}") for i in range(tables)]
        client = LakepropClient(config.kafka, config.state, spark)
        for _, table in names:
            client.register_job(
                JobKey(1, "db", table, "copy"),
                {
                    "trigger": {"kind": "greedy"},
                    "iteration": {
                        "consumer": {"type": "replica", "options": {"primary_key": ["id"]}}
                    },
                },
            )
        return cls(spark, config, cluster, names), paths

    def settled(self, expected: set[str]) -> dict[str, Member]:
        """The group once exactly ``expected`` hold all the slots between them."""
        return settled(self.config.kafka, self.cluster, self.names, expected, timeout=600)

    def served(self, since: float, tables: set[str], not_by: str = "") -> float:
        """When the first iteration on one of ``tables`` started after ``since`` on an
        instance other than ``not_by`` (every one of them, when ``not_by`` is empty)."""

        def check() -> float:
            rows = (
                self.spark.read.format("delta")
                .load(self.history)
                .where(F.col("table").isin(sorted(tables)))
                .where(F.col("started_at") >= F.lit(since).cast("timestamp"))
                .select("table", "owner", "started_at")
                .collect()
            )
            starts = [
                (r["table"], r["started_at"].timestamp())
                for r in rows
                if not (not_by and r["owner"].startswith(f"{not_by}@"))
            ]
            assert starts, "not served yet"
            if not not_by:
                assert {t for t, _ in starts} == tables, "not every table served yet"
            return min(s for _, s in starts)

        return assert_eventually(check, timeout=600, interval=0.2, changes=[self.watch])

    def reached(self, path: str) -> None:
        copy = f"{path}_copy"
        assert_eventually(lambda: _same(self.spark, path, copy), timeout=300, interval=1.0)


def _same(spark: SparkSession, source: str, copy: str) -> None:
    assert same_rows(spark.read.format("delta").load(source), spark.read.format("delta").load(copy))
