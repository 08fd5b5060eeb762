"""Rolling restart: three instances restarted one by one under a trickle of commits.

Three instances (``spark-submit.sh``, a local master of one core each) share
`tables` tables, one greedy replica job each. Once the group has settled, each
instance in turn is stopped as an operator does (``SIGTERM``: it drains and
leaves) and started again under its id, while one row is committed to a random
table every `gap_ms` milliseconds. Figures:

* **slots moved**: claims of a slot by another instance than its last claimant,
  from the membership topic (the target is 0);
* **restart**: from the ``SIGTERM`` until the instance holds slots again;
* **lateness** of each commit: from its commit to the start of the first
  iteration that reaches its version. No commit may be later than the tick plus
  the longest restart.

lakeprop's side runs the instances as static members (`cluster.static_membership`)
whose session timeout (`session` s) outlasts a restart; the baseline is the same
round with dynamic membership, where a stopped instance's slots move to the
others at once and back when it returns. At the end every replica must equal its
source.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Figure, Result, percentile, same_rows
from bench.failover import Fleet, add_row
from devkit.instances import Instance, claims_so_far, slots_moved, stopped_at_exit
from devkit.waiting import assert_eventually
from lakeprop.config import AppConfig, ClusterConfig

TITLE = "rolling restart"
INSTANCES = 3
TICK = 1.0
"""The instances' tick (``devkit.instances.Instance`` runs them at 1 s)."""


@dataclass
class Round:
    """What one round of restarts measured."""

    moved: int = 0
    restarts: list[float] = field(default_factory=list)
    commits: list[tuple[str, int, float]] = field(default_factory=list)
    """(table, version, committed at) of each trickled commit."""
    lateness: list[float] = field(default_factory=list)


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    tables: int = 12,
    session: int = 180,
    gap_ms: int = 1000,
    **_: Any,
) -> Result:
    result = Result(
        TITLE,
        {"tables": tables, "instances": INSTANCES, "session_s": session, "gap_ms": gap_ms},
        baseline="the same restarts with dynamic membership",
    )
    sides = {}
    for static in (True, False):
        side = workdir / ("static" if static else "dynamic")
        sides[static] = _round(spark, side, bootstrap, tables, session, gap_ms / 1000, static)
    ours, theirs = sides[True], sides[False]
    result.figures += [
        Figure("slots moved to another instance", "count", ours.moved, theirs.moved),
        Figure(
            "restart, longest", "s", round(max(ours.restarts), 2), round(max(theirs.restarts), 2)
        ),
        Figure(
            "commit to its iteration's start, p50",
            "s",
            round(percentile(ours.lateness, 0.5), 2),
            round(percentile(theirs.lateness, 0.5), 2),
        ),
        Figure(
            "commit to its iteration's start, max",
            "s",
            round(max(ours.lateness), 2),
            round(max(theirs.lateness), 2),
        ),
        Figure("commits during the restarts", "count", len(ours.commits), len(theirs.commits)),
    ]
    result.checks["no slot moved with static membership"] = ours.moved == 0
    result.checks["no commit later than the tick plus the longest restart"] = max(
        ours.lateness
    ) <= TICK + max(ours.restarts)
    return result


def _round(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    tables: int,
    session: int,
    gap: float,
    static: bool,
) -> Round:
    """Register the jobs, start the instances, restart each in turn under the trickle,
    and measure; every replica equals its source at the end."""
    fleet, paths = Fleet.with_replicas(spark, workdir, bootstrap, tables, session, static)
    config, cluster, names = fleet.config, fleet.cluster, fleet.names
    trickle = Trickle(spark, config, [t for _, t in names], gap)
    measured = Round()
    started = {f"i{n}": Instance(f"i{n}", config, workdir, cluster).start() for n in range(3)}
    with stopped_at_exit(started) as running:
        fleet.settled(set(running))
        fleet.served(time.time() - 3600, {t for _, t in names})
        fleet.settled(set(running))
        before = claims_so_far(config.kafka, cluster)
        for name in sorted(running):
            measured.restarts.append(_restart(running, name, config, cluster, trickle))
        measured.moved = slots_moved(before, claims_so_far(config.kafka, cluster))
        measured.commits = trickle.commits
        measured.lateness = _lateness(spark, fleet, trickle.commits)
        for path in paths:
            fleet.reached(path)
    assert all(
        same_rows(spark.read.format("delta").load(p), spark.read.format("delta").load(f"{p}_copy"))
        for p in paths
    ), "a replica differs from its source"
    return measured


def _restart(
    running: dict[str, Instance],
    name: str,
    config: AppConfig,
    cluster: ClusterConfig,
    trickle: Trickle,
) -> float:
    """Stop ``name`` (``SIGTERM``) and start it again under its id, committing all the
    while; seconds until it holds slots again and every instance holds about as many."""
    began = time.time()
    claimed = {s: len(c) for s, c in claims_so_far(config.kafka, cluster).items()}
    old = running[name]
    old.terminate()
    assert old.process is not None
    while old.process.poll() is None:
        trickle.step()
        assert time.time() - began < 300, f"{name} did not stop on SIGTERM"
    running[name] = again = Instance(name, config, old.workdir, cluster).start()

    def back() -> bool:
        claims = claims_so_far(config.kafka, cluster)
        holders = Counter(c[-1] for c in claims.values())
        reclaimed = any(c[claimed.get(s, 0) :].count(name) for s, c in claims.items())
        even = set(holders) == set(running) and max(holders.values()) - min(holders.values()) <= 1
        return reclaimed and even

    while not back():
        trickle.step()
        assert again.process is not None and again.process.poll() is None, f"{name} exited"
        assert time.time() - began < 600, f"{name} did not take slots again"
    return time.time() - began


class Trickle:
    """One row committed to a random table every ``gap`` seconds, with its version."""

    def __init__(self, spark: SparkSession, config: AppConfig, tables: list[str], gap: float):
        self.spark = spark
        self.warehouse = config.tables.warehouse
        self.versions = dict.fromkeys(tables, 1)  # ``sources`` leaves each at version 1
        self.gap = gap
        self.rng = random.Random(7)
        self.ids = iter(range(1, 1_000_000_000))
        self.commits: list[tuple[str, int, float]] = []
        self.due = time.time()

    def step(self) -> None:
        """The next commit once it is due (at once when behind)."""
        time.sleep(max(0.0, self.due - time.time()))
        table = self.rng.choice(sorted(self.versions))
        add_row(self.spark, f"{self.warehouse}/db/{table}", next(self.ids))
        self.versions[table] += 1
        self.commits.append((table, self.versions[table], time.time()))
        self.due = max(self.due + self.gap, time.time())


def _lateness(
    spark: SparkSession, fleet: Fleet, commits: list[tuple[str, int, float]]
) -> list[float]:
    """Per commit, from its commit to the start of the first successful iteration on
    its table that reaches its version (waiting until every commit has one)."""

    def starts() -> list[float]:
        rows = (
            spark.read.format("delta")
            .load(fleet.history)
            .where(F.col("outcome") == "success")
            .select("table", "to_version", F.col("started_at").cast("double").alias("at"))
            .collect()
        )
        found = []
        for table, version, at in commits:
            covering = [r["at"] for r in rows if r["table"] == table and r["to_version"] >= version]
            assert covering, f"{table} version {version} not propagated yet"
            found.append(max(0.0, min(covering) - at))
        return found

    return assert_eventually(starts, timeout=300, interval=1.0, changes=[fleet.watch])
