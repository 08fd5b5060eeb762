"""The change set of an iteration: read once, held while the consumers read it,
released after.

A tail reads the Change Data Feed of ``(from, to]`` with the end version pinned
(an open end would re-resolve "latest" at every action), checkpoints it
locally as it counts it per version (the same Spark job finds the least and
greatest value of the members' key columns, by which their MERGEs skip target
files). In a large tail the last change per key is computed once per key and
start for the consumers that ask, and held likewise (:class:`HeldLatest`). A
snapshot holds the table as of ``to``. When the range can no longer be read
(vacuumed, past log retention, change feed off), the change set becomes a
snapshot at the same version: a full resync, recorded as such. Missing files
are never skipped. A range Delta refuses to read across a schema change is a
permanent error saying what changed (:class:`ColumnChanges`); one that only
widened column types is read at the wider types.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from lakeprop.changes import (
    Bounds,
    bounded_columns,
    bounds_after,
    latest_change_per_key,
    own_columns,
    widens,
)
from lakeprop.changes.feed import schema_changed, unreadable
from lakeprop.changes.held import release
from lakeprop.engine.fanout import session_confs
from lakeprop.engine.model import CancelToken, IterationKind, IterationPlan, IterationResult
from lakeprop.engine.sparkstats import cached_bytes
from lakeprop.errors import ErrorCode, LakepropError, PermanentError
from lakeprop.tables.resolve import TableHandle

log = logging.getLogger("lakeprop.engine.iteration")


COUNTING_CONFS = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "1"}
"""While the change set is stored and counted per commit version: the count's
shuffle carries one row per version, so one reduce task and no adaptive
re-planning (which runs each stage as a job of its own) suit it at any size."""


TALLY = "_tally"
"""How the names of the ``tallies`` a read is given start (:func:`read`)."""


@dataclass
class ChangeSet:
    """What one iteration read: the rows, and for a tail their count and key bounds
    per commit version (a snapshot has neither)."""

    data: DataFrame
    per_version: dict[int, int] = field(default_factory=dict)
    bounds: dict[int, Bounds] = field(default_factory=dict)
    held: HeldLatest | None = None
    """The last change per key, held for the consumers of a large tail."""
    tallied: dict[int, dict[str, Any]] | None = None
    """Per commit version, the values of the ``tallies`` the read was given (a tail
    read with some; None when it was given none, or counting them failed)."""

    def after(self, start: int) -> DataFrame:
        """The changes of the versions after ``start`` (one member's slice)."""
        return self.data.where(F.col("_commit_version") > start)

    def rows_after(self, start: int) -> int:
        return sum(n for v, n in self.per_version.items() if v > start)

    def bounds_after(self, start: int) -> Bounds:
        return bounds_after(self.bounds, start)

    @property
    def source_columns(self) -> tuple[str, ...]:
        """The source's columns, the change feed's own aside."""
        return own_columns(self.data.columns)

    def release(self, spark: SparkSession) -> int:
        """Free what is held; the bytes the last-change sets took in the block store."""
        taken = 0 if self.held is None else self.held.release(spark)
        release(self.data)
        return taken


def read(
    source: TableHandle,
    plan: IterationPlan,
    result: IterationResult,
    token: CancelToken,
    keys: Sequence[str],
    tallies: Sequence[Column] = (),
) -> ChangeSet:
    """The checkpointed change set of a tail, with its rows per commit version
    and the bounds of the ``keys`` it can bound per version (one Spark job
    finds both as it stores the blocks), or the table as of ``to_version`` for
    a snapshot (no counts, no bounds); a tail whose range is no longer readable
    becomes a snapshot (resync).

    ``tallies`` are more aggregates taken per version in the same job, named from
    :data:`TALLY` on: the members' expectations
    (:class:`~lakeprop.engine.expect.Tally`). They are the members' own, so one
    that fails to count (an expression that cannot run on these rows) harms no
    other: whatever the failure, the change set is read again without them (that
    read alone decides what a failure to read means), and each member counts its
    rules itself, failing alone (``tallied`` stays None)."""
    if plan.kind is IterationKind.TAIL and plan.from_version == plan.to_version:
        # a tail of a job whose joined tables moved while its own source did not
        return ChangeSet(_no_changes(source, plan.to_version), tallied={} if tallies else None)
    if plan.kind is IterationKind.TAIL and tallies:
        scans = result.source_scans
        try:
            return _read(source, plan, result, token, keys, tallies)
        except _TallyFailed as failed:
            log.warning(
                "%s: the rules' counts failed on the change set; each job counts its own: %s",
                source,
                str(failed.__cause__).splitlines()[0][:300],
            )
            result.source_scans = scans  # the read that failed held nothing
    return _read(source, plan, result, token, keys)


class _TallyFailed(Exception):
    """The change set's read failed with the members' tallies in it (the cause)."""


def _read(
    source: TableHandle,
    plan: IterationPlan,
    result: IterationResult,
    token: CancelToken,
    keys: Sequence[str],
    tallies: Sequence[Column] = (),
) -> ChangeSet:
    """:func:`read`, with ``tallies`` in the count, or none; a failure with tallies
    in it raises :class:`_TallyFailed` (unless cancelled)."""
    if plan.kind is IterationKind.TAIL:
        data: DataFrame | None = None
        try:
            data = _read_changes(source, plan)
            result.source_scans += 1
            bounded = bounded_columns(keys, {f.name: f.dataType for f in data.schema.fields})
            extremes = [
                agg(data[c]).alias(f"_{name}{i}")
                for i, c in enumerate(bounded)
                for name, agg in (("low", F.min), ("high", F.max))
            ]
            try:
                counted = (
                    data.groupBy("_commit_version").agg(
                        F.count(F.lit(1)).alias("_rows"), *extremes, *tallies
                    )
                ).collect()
            except Exception as exc:
                if not tallies or token.cancelled:
                    raise
                raise _TallyFailed() from exc
            tallied = (
                {
                    int(r["_commit_version"]): {
                        n: v for n, v in r.asDict().items() if n.startswith(TALLY)
                    }
                    for r in counted
                }
                if tallies
                else None
            )
            per_version = {int(r["_commit_version"]): int(r["_rows"]) for r in counted}
            bounds: dict[int, Bounds] = {
                int(r["_commit_version"]): {
                    c.lower(): (r[f"_low{i}"], r[f"_high{i}"]) for i, c in enumerate(bounded)
                }
                for r in counted
            }
            result.rows_read = token.cached_rows = sum(per_version.values())
            return ChangeSet(data, per_version, bounds, tallied=tallied)
        except Exception as exc:
            if data is not None:
                release(data)
            if isinstance(exc, _TallyFailed):
                raise
            if not token.cancelled and schema_changed(exc):
                changes = column_changes(source, plan)
                if not changes.widening_only:
                    raise changes.error() from None
                log.info("%s: read across widened column types %s", source, changes.changed)
                with session_confs(source.spark, {WIDENING_READ: "true"}):
                    return _read(source, plan, result, token, keys, tallies)
            if token.cancelled or not unreadable(exc):
                raise
            result.kind = IterationKind.SNAPSHOT
            result.resync_reason = (
                f"changes of versions {plan.from_version}..{plan.to_version} are no longer "
                f"readable, resynced from a snapshot: {str(exc).splitlines()[0][:300]}"
            )
            log.warning(
                "iteration %s on %s: %s", plan.iteration_id, plan.table, result.resync_reason
            )
    # Checkpointed like a change set, not persisted: Spark's cache manager keeps
    # one entry per plan, so two snapshots of one table version (two new jobs,
    # whose snapshots run side by side) would share it, and the first to end
    # would unpersist the other's rows from under it.
    snapshot = source.load(source.reader().option("versionAsOf", plan.to_version))
    snapshot = snapshot.localCheckpoint(eager=False)
    result.source_scans += 1
    result.rows_read = token.cached_rows = int(snapshot.count())
    return ChangeSet(snapshot)


WIDENING_READ = (
    "spark.databricks.delta.changeDataFeed.unsafeBatchReadOnIncompatibleSchemaChanges.enabled"
)
"""Delta's switch to read a change feed across a schema change at the end version's
schema: set only for a range whose columns were widened (or added), never dropped,
renamed or changed otherwise, so every value reads at its wider type."""


@dataclass(frozen=True)
class ColumnChanges:
    """How a source's columns changed between two versions."""

    source: str
    start: int
    end: int
    dropped: list[str]
    changed: list[tuple[str, DataType, DataType]]
    added: list[str]

    @property
    def widening_only(self) -> bool:
        """Nothing dropped or renamed, every changed type widened in place."""
        return not self.dropped and all(widens(old, new) for _, old, new in self.changed)

    def error(self) -> PermanentError:
        """A permanent error saying what changed (a resync rebuilds from the source)."""
        what = []
        if self.dropped:
            what.append(f"it no longer has column(s) {self.dropped}")
        if self.changed:
            shown = [f"{c} {o.simpleString()} -> {n.simpleString()}" for c, o, n in self.changed]
            what.append(f"column type(s) changed: {shown}")
        if self.added:
            what.append(f"new column(s) {self.added}")
        return PermanentError(
            f"source {self.source} changed its columns between versions {self.start} and "
            f"{self.end} in a way its change feed cannot be read across: "
            f"{'; '.join(what) or 'its column mapping changed'}; resync the job to rebuild it "
            "from the source as it is now",
            ErrorCode.SOURCE_SCHEMA_CHANGED,
        )


def column_changes(source: TableHandle, plan: IterationPlan) -> ColumnChanges:
    """What changed in the source's columns over a range whose change feed Delta will
    not read as it is."""
    assert plan.from_version is not None

    def fields(version: int) -> dict[str, DataType]:
        schema = source.load(source.reader().option("versionAsOf", version)).schema
        return {f.name: f.dataType for f in schema.fields}

    before, after = fields(plan.from_version), fields(plan.to_version)
    return ColumnChanges(
        str(source),
        plan.from_version,
        plan.to_version,
        [c for c in before if c not in after],
        [(c, before[c], after[c]) for c in before if c in after and before[c] != after[c]],
        [c for c in after if c not in before],
    )


def _no_changes(source: TableHandle, version: int) -> DataFrame:
    """An empty change set of the source at ``version``: its columns and the change
    feed's, no rows (read by no Spark job)."""
    rows = source.load(source.reader().option("versionAsOf", version)).limit(0)
    return rows.select(
        "*",
        F.lit(None).cast("string").alias("_change_type"),
        F.lit(None).cast("long").alias("_commit_version"),
        F.lit(None).cast("timestamp").alias("_commit_timestamp"),
    )


def _read_changes(source: TableHandle, plan: IterationPlan) -> DataFrame:
    assert plan.from_version is not None
    reader = (
        source.reader()
        .option("readChangeFeed", "true")
        .option("startingVersion", plan.from_version + 1)
        .option("endingVersion", plan.to_version)
    )
    # Checkpointed, not cached: the first job on it (the count per version)
    # stores its blocks and cuts its lineage, so every consumer reads those very
    # rows and never the feed again, and a MERGE need not copy them once more
    # to be sure they stay the same (ConsumerContext.merging_changes).
    return source.load(reader).localCheckpoint(eager=False)


class HeldLatest:
    """The last change per key of a tail's change set, for the consumers that ask
    (:meth:`ConsumerContext.latest_changes`): computed once per key and start
    version, whichever consumer asks first (the others with the same ones wait
    for it), and held as a checkpoint until the iteration releases it."""

    def __init__(self, data: DataFrame, token: CancelToken) -> None:
        self.data = data
        self.token = token
        self._lock = threading.Lock()
        self._computing: dict[tuple[tuple[str, ...], int], threading.Lock] = {}
        self._held: dict[tuple[tuple[str, ...], int], DataFrame] = {}

    def after(self, start: int, key: Sequence[str]) -> DataFrame:
        """The last change per ``key`` among the changes after version ``start``."""
        slot = (tuple(key), start)
        with self._lock:
            computing = self._computing.setdefault(slot, threading.Lock())
        with computing:
            if slot not in self._held:
                if self.token.cancelled:  # the one computing it was cancelled: no retry
                    raise LakepropError(self.token.reason, self.token.code)
                changes = self.data.where(F.col("_commit_version") > start)
                self._held[slot] = latest_change_per_key(changes, list(key)).localCheckpoint()
            return self._held[slot]

    def release(self, spark: SparkSession) -> int:
        """Free what is held; the bytes it took in the block store."""
        taken = 0
        for held in self._held.values():
            taken += cached_bytes(spark, held) or 0
            release(held)
        self._held.clear()
        return taken
