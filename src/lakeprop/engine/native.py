"""The native path: a small tail or snapshot iteration run in the driver with delta-rs.

With ``engine.small_iterations = "auto"`` a tail goes this way when all of
these hold (:func:`plan_native`), and on Spark otherwise:

* every member's consumer has a native path (``Consumer.native``);
* its change set, estimated from the commits' operation metrics before anything
  is read, is at most ``engine.native_max_rows`` rows;
* the source and every target open with delta-rs (the storage is reachable from
  the driver: :meth:`lakeprop.storage.Storage.options`), the targets' commits
  exclude Spark's (:meth:`lakeprop.storage.Storage.safety`: not so on S3 without
  lakeprop's log store), and delta-rs writes every feature each target's
  protocol uses.

A native iteration reads the change set once (delta-rs ``load_cdf``: no Spark
job) and hands it, as Arrow, to each member's ``apply_changes_native``, which
checks the target's transaction id and MERGEs with it in the same commit.

A snapshot goes this way when its consumers can all write one natively
(``Consumer.native_snapshot``) and the table, by its files' row counts, has at
most as many rows (:func:`_small_snapshot`; what else keeps one on Spark is in
:func:`_snapshot_targets`): one delta-rs read of the table at the version,
handed to each member's ``snapshot_native``.

Both pass the same fault points as a Spark iteration, so crash recovery is the
same. The history records which path each iteration took (``path``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakeprop import expectations
from lakeprop.changes import CDF_COLUMNS, own_columns
from lakeprop.consumers import native
from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.engine import model
from lakeprop.engine.expect import QUARANTINE
from lakeprop.engine.fanout import fan_out, member_context, run_member
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    MemberJob,
)
from lakeprop.faults import fault_point
from lakeprop.registry import get_consumer_type
from lakeprop.spec import target_table
from lakeprop.storage import Storage
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import CHANGE_FEED_PROPERTY, Tables

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MAX_VERSIONS = 100
"""A longer range is a catch-up, not a small iteration: Spark reads it."""


@dataclass(frozen=True)
class NativeSettings:
    """``engine.small_iterations``, ``engine.native_max_rows`` and the storage options."""

    mode: str = "auto"
    max_rows: int = 10_000
    storage: Storage = field(default_factory=Storage)
    """How delta-rs reaches the tables, and whether its commits exclude Spark's there."""

    @property
    def enabled(self) -> bool:
        return self.mode == "auto" and self.max_rows > 0


@dataclass(frozen=True)
class NativePlan:
    """What a native iteration needs: where the source is, and each target's."""

    source: str
    targets: dict[int, str]
    """Job id -> target location."""


class NativeReadFailed(Exception):
    """delta-rs could not read the change set (files vacuumed, say): nothing was
    written, and the iteration runs on Spark, which decides what the failure means."""

    @classmethod
    def of(cls, exc: Exception) -> NativeReadFailed:
        return cls(str(exc).splitlines()[0][:300] if str(exc) else repr(exc))


_UNAVAILABLE_LOGGED: list[bool] = []


def why_not(plan: IterationPlan, jobs: Sequence[MemberJob], settings: NativeSettings) -> str | None:
    """Why a plan cannot run natively, from the plan alone (no I/O); None when it may."""
    if not settings.enabled:
        return f"engine.small_iterations = {settings.mode!r}"
    snapshot = plan.kind is IterationKind.SNAPSHOT
    if not snapshot:
        if plan.kind is not IterationKind.TAIL or plan.from_version is None:
            return "not a tail"
        if plan.to_version - plan.from_version > MAX_VERSIONS:
            return f"more than {MAX_VERSIONS} versions"
    types = {j.spec.iteration.consumer.type for j in jobs}
    slow = sorted(t for t in types if not _native(t, snapshot))
    if slow:
        return f"consumer type(s) {slow} have no native {'snapshot' if snapshot else 'path'}"
    if any(expectations.OPTION in j.spec.iteration.consumer.options for j in jobs):
        return "a job has expectations, which run on Spark"
    return None


def _native(consumer_type: str, snapshot: bool) -> bool:
    kind = get_consumer_type(consumer_type)
    return kind.native_snapshot if snapshot else kind.native


def plan_native(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    settings: NativeSettings,
) -> NativePlan | str:
    """The native plan of a tail or a snapshot, or why it runs on Spark."""
    reason = why_not(plan, jobs, settings)
    if reason is not None:
        return reason
    if not native.available():
        if not _UNAVAILABLE_LOGGED:
            _UNAVAILABLE_LOGGED.append(True)
            log.warning(
                "the deltalake and pyarrow packages are not installed (lakeprop[native]): "
                "every iteration runs on Spark"
            )
        return "deltalake is not installed"
    try:
        source = tables.location(plan.table.database, plan.table.table)
    except Exception as exc:  # a metastore table without a location
        return f"source location: {exc}"
    snapshot = plan.kind is IterationKind.SNAPSHOT
    small = _small_range(spark, source, plan, settings.max_rows) if not snapshot else None
    if small is not None:
        return small
    try:
        read = native.open_table(source, settings.storage)
        if snapshot:
            read.load_as_version(plan.to_version)
            small = _small_snapshot(read, settings.max_rows)
        unread = small or native.readable(read)
        if unread is not None:
            return unread if small else f"source uses {unread}"
        fields = tuple((f.name, f.type) for f in read.schema().fields)
        targets = (
            _snapshot_targets(spark, jobs, tables, settings, read.schema().fields)
            if snapshot
            else _targets(spark, jobs, tables, settings, fields)
        )
    except Exception as exc:  # unreachable storage, a missing target, no credentials
        return f"delta-rs cannot open the tables: {str(exc).splitlines()[0][:200]}"
    if isinstance(targets, str):
        return targets
    return NativePlan(source, targets)


def _targets(
    spark: SparkSession,
    jobs: Sequence[MemberJob],
    tables: Tables,
    settings: NativeSettings,
    fields: tuple[tuple[str, Any], ...],
) -> dict[int, str] | str:
    """Each member's target location ("" for a target that is no table), or why one
    cannot be written natively: the consumer says why (:meth:`Consumer.why_not_native`),
    a feature delta-rs does not write, or a source column it lacks (Spark adds it)."""
    targets: dict[int, str] = {}
    columns = tuple(name for name, _ in fields)
    for job in jobs:
        context = _context(spark, job, tables, settings, None, 0, columns)
        consumer: Consumer = get_consumer_type(job.spec.iteration.consumer.type).factory(context)
        refused = consumer.why_not_native(fields)
        if refused is not None:
            return refused
        if not consumer.table_target:  # a topic: no table to open or check
            targets[job.member.job_id] = ""
            continue
        target = consumer.target
        location = target.location()
        unsafe = _unsafe_for_delta_rs(location, settings)
        if unsafe is not None:
            return unsafe
        table = native.open_table(location, settings.storage)
        blocked = native.writable(table)
        if blocked is not None:
            return f"target {target} uses {blocked}, which delta-rs does not write"
        present = {f.name.lower() for f in table.schema().fields}
        lacking = [c for c in consumer.written_columns() if c.lower() not in present]
        if lacking:
            return f"target {target} lacks column(s) {lacking} the source has"
        targets[job.member.job_id] = location
    return targets


def _snapshot_targets(
    spark: SparkSession,
    jobs: Sequence[MemberJob],
    tables: Tables,
    settings: NativeSettings,
    fields: Sequence[Any],
) -> dict[int, str] | str:
    """Each member's target location for a native snapshot ("" for a target that is
    no table), or why Spark writes it: what the consumer says
    (:meth:`Consumer.why_not_native`); a column named in another case than the
    source's, of a nested type, or with metadata (a comment, a generation
    expression, a CHAR length: Spark resolves, writes and carries those); a new
    metastore table (Spark's ``saveAsTable`` replaces it); a quarantine table
    (:func:`_quarantined`); what :func:`_overwritable` refuses; or defaults for new
    tables the session sets."""
    names = own_columns(f.name for f in fields)
    probe = DeltaLogProbe(spark)
    targets: dict[int, str] = {}
    creates = False
    for job in jobs:
        context = _context(spark, job, tables, settings, None, 0, names)
        consumer: Consumer = get_consumer_type(job.spec.iteration.consumer.type).factory(context)
        refused = consumer.why_not_native(tuple((f.name, f.type) for f in fields)) or (
            _quarantined(consumer, probe)
        )
        if refused is not None:
            return refused
        if not consumer.table_target:  # a topic: no table to write or check
            targets[job.member.job_id] = ""
            continue
        odd = _unwritable_columns(consumer.written_columns(), fields)
        if odd is not None:
            return odd
        target = consumer.target
        if target.path is None:  # saveAsTable replaces it in the metastore
            return f"target {target} is a metastore table, which Spark overwrites"
        location = target.location()
        refused = _unsafe_for_delta_rs(location, settings) or _overwritable(
            consumer, location, probe, settings
        )
        if refused is not None:
            return refused
        creates = creates or probe.latest_version(location) is None
        targets[job.member.job_id] = location
    if creates:
        defaults = table_defaults(spark)
        if defaults:
            return f"the session sets {defaults} for new tables"
    return targets


def _unwritable_columns(written: Sequence[str], fields: Sequence[Any]) -> str | None:
    """Why Spark writes these columns of the source's (delta-rs) fields: one named in
    another case, of a nested type, or with metadata; None when delta-rs may."""
    names = {f.name for f in fields}
    other = [c for c in written if c not in names]
    if other:
        return f"column(s) {other} are named otherwise in the source"
    deep = [c for c in written if c in {f.name for f in fields if not _flat(f.type)}]
    if deep:
        return f"column(s) {deep} are of a nested type"
    noted = [c for c in written if c in {f.name for f in fields if f.metadata}]
    if noted:
        return f"column(s) {noted} carry metadata (a comment, say)"
    return None


def _overwritable(
    consumer: Consumer, location: str, probe: DeltaLogProbe, settings: NativeSettings
) -> str | None:
    """Why delta-rs must not overwrite the target at ``location`` as Spark would
    (a feature it does not write, partitions, the change feed off); None when it
    may, or when there is none yet."""
    target = consumer.target
    if probe.latest_version(location) is not None:
        table = native.open_table(location, settings.storage)
        blocked = native.writable(table)
        if blocked is not None:
            return f"target {target} uses {blocked}, which delta-rs does not write"
        metadata = table.metadata()
        if metadata.partition_columns:
            return f"target {target} is partitioned"
        if consumer.change_feed and metadata.configuration.get(CHANGE_FEED_PROPERTY) != "true":
            return f"target {target} has its change feed off"
    return None


def _quarantined(consumer: Consumer, probe: DeltaLogProbe) -> str | None:
    """Why Spark writes the snapshot: the job's quarantine table is there (left by an
    earlier configuration), which a snapshot empties; None when there is none."""
    database, name = target_table(consumer.context.key, consumer.context.options)
    quarantine = consumer.context.locate(database, f"{name}{QUARANTINE}")
    there = (
        quarantine.exists()
        if quarantine.path is None
        else probe.latest_version(quarantine.path) is not None
    )
    return f"a snapshot empties {quarantine}" if there else None


def _flat(kind: Any) -> bool:
    """Whether a delta-rs type is a primitive, or an array of primitives."""
    from deltalake.schema import ArrayType, PrimitiveType

    if isinstance(kind, ArrayType):
        return isinstance(kind.element_type, PrimitiveType)
    return isinstance(kind, PrimitiveType)


TABLE_DEFAULTS = "spark.databricks.delta.properties.defaults."
"""Delta's session confs that set the properties of every table Spark creates."""


def table_defaults(spark: SparkSession) -> list[str]:
    """The session's defaults for new tables' properties (a command: no Spark job)."""
    return sorted(
        r["key"] for r in spark.sql("SET").collect() if r["key"].startswith(TABLE_DEFAULTS)
    )


def _small_snapshot(table: DeltaTable, bound: int) -> str | None:
    """Why the table (loaded at the snapshot's version) is no small snapshot: more
    than ``bound`` rows by its files' counts, a file without one, deletion vectors
    enabled, or a timestamp partition column (Spark reads a value without a zone in
    the session's); None when it is one."""
    import pyarrow as pa

    files = pa.table(table.get_add_actions(flatten=True))
    counts = files.column("num_records").to_pylist() if files.num_rows else []
    if any(c is None for c in counts):
        return "a file of the source does not count its rows"
    if sum(counts) > bound:
        return f"more than {bound} rows (engine.native_max_rows)"
    reader, _ = native.features(table)
    if "deletionVectors" in reader:  # delta-rs reads no snapshot of such a table
        return "the source has deletion vectors enabled"
    kinds = {f.name: f.type for f in table.schema().fields}
    stamped = [
        c
        for c in table.metadata().partition_columns
        if getattr(kinds.get(c), "type", "") in ("timestamp", "timestamp_ntz")
    ]
    if stamped:  # a partition value without a zone: delta-rs reads it as UTC
        return f"the source is partitioned by timestamp column(s) {stamped}"
    return None


def _unsafe_for_delta_rs(location: str, settings: NativeSettings) -> str | None:
    """Why delta-rs must not commit to ``location`` beside Spark; None when it may."""
    safety = settings.storage.safety(location)
    return None if safety.across_engines else f"the native path is off: {safety.why}"


def _small_range(spark: SparkSession, location: str, plan: IterationPlan, bound: int) -> str | None:
    """Why a tail's range is no small change set (:func:`_estimated_rows`); None when it is."""
    rows = _estimated_rows(spark, location, plan, bound)
    if isinstance(rows, str):
        return rows
    if rows > bound:
        return f"more than {bound} change rows (engine.native_max_rows)"
    return None


def _estimated_rows(
    spark: SparkSession, location: str, plan: IterationPlan, bound: int
) -> int | str:
    """Change rows of the range from the commits' metrics (one commit file each),
    stopping as soon as the bound is passed; or why a commit rules the native path
    out: it cannot tell (an overwrite whose removed rows nothing counts: 100 M
    deleted rows are not a small change set, whatever it wrote), it changes the
    table's metadata (Spark reads a change feed across a schema change, or refuses
    to, as Delta defines), or delta-rs would read its change rows wrong."""
    assert plan.from_version is not None
    probe = DeltaLogProbe(spark)
    total = 0
    for version in range(plan.from_version + 1, plan.to_version + 1):
        commit = probe.commit_changes(location, version)
        if commit is None:
            return f"commit {version} of the source is gone"
        if commit.metadata:
            return f"commit {version} of the source changes its metadata"
        if not commit.exact:
            return f"commit {version} of the source removes files whose rows its log does not count"
        if commit.vectored_removes:
            return (
                f"commit {version} of the source removes a file with a deletion vector, "
                "whose change rows delta-rs reads wrong"
            )
        total += commit.rows
        if total > bound:
            return total
    return total


def run_native(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    token: CancelToken,
    settings: NativeSettings,
    where: NativePlan,
    result: IterationResult,
) -> None:
    """Read the range (or a snapshot's table) once with delta-rs and hand it to every
    member, in turn.

    :class:`NativeReadFailed` leaves ``result`` as it was: nothing was read, nothing
    written, and the caller runs the iteration on Spark instead."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if plan.kind is IterationKind.SNAPSHOT:
        _snapshot(spark, plan, jobs, tables, token, settings, where, result)
        return
    assert plan.from_version is not None
    try:
        source = native.open_table(where.source, settings.storage)
        reader = source.load_cdf(
            starting_version=plan.from_version + 1, ending_version=plan.to_version
        )
        changes: pa.Table = in_schema_order(source, native.plain(pa.table(reader)))
        if any(_reads_commit_timestamps(j) for j in jobs):
            changes = with_change_feed_times(spark, where.source, plan, changes)
    except Exception as exc:
        raise NativeReadFailed.of(exc) from exc
    _read_once(result, token, changes)
    columns = tuple(c for c in changes.column_names if c not in CDF_COLUMNS)
    fault_point("iteration.before_write")

    def consume(session: SparkSession, job: MemberJob) -> model.MemberResult:
        start = job.member.from_version
        assert start is not None and plan.from_version is not None
        mine = changes
        if start > plan.from_version:
            mine = changes.filter(pc.greater(changes["_commit_version"], start))
        context = _context(session, job, tables, settings, token, mine.num_rows, columns)

        def call(consumer: Consumer) -> int:
            return consumer.apply_changes_native(mine, start, plan.to_version)

        return run_member(job, context, token, call, f"native iteration {plan.iteration_id}")

    fan_out(spark, jobs, consume, result, 1, {})
    fault_point("iteration.after_writes")


def _snapshot(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    token: CancelToken,
    settings: NativeSettings,
    where: NativePlan,
    result: IterationResult,
) -> None:
    """A snapshot's table as of ``plan.to_version``, read once and handed to every
    member's ``snapshot_native``, through the fault points of a Spark snapshot."""

    try:
        source = native.open_table(where.source, settings.storage)
        source.load_as_version(plan.to_version)
        rows: pa.Table = in_schema_order(source, native.plain(source.to_pyarrow_table()))
    except Exception as exc:
        raise NativeReadFailed.of(exc) from exc
    _read_once(result, token, rows)
    fault_point("iteration.before_write")

    def consume(session: SparkSession, job: MemberJob) -> model.MemberResult:
        context = _context(
            session, job, tables, settings, token, rows.num_rows, own_columns(rows.column_names)
        )

        def call(consumer: Consumer) -> int:
            return consumer.snapshot_native(rows, plan.to_version)

        return run_member(job, context, token, call, f"native iteration {plan.iteration_id}")

    fan_out(
        spark, jobs, consume, result, 1, {}, after_first=lambda: fault_point("iteration.snapshot")
    )
    fault_point("iteration.after_writes")


def _read_once(result: IterationResult, token: CancelToken, data: pa.Table) -> None:
    """Record a native read: one scan of the source, its rows and bytes held."""
    result.path = "native"
    result.source_scans = 1
    result.rows_read = token.cached_rows = data.num_rows
    result.bytes_cached = token.cached_bytes = int(data.nbytes)


def in_schema_order(source: DeltaTable, changes: pa.Table) -> pa.Table:
    """The change set's columns in the source's order, as Spark's change feed has
    them (delta-rs puts partition columns last), then the change feed's."""
    names = [f.name for f in source.schema().fields]
    rest = [c for c in changes.column_names if c not in names]
    return changes.select([*(c for c in names if c in changes.column_names), *rest])


def _reads_commit_timestamps(job: MemberJob) -> bool:
    factory = get_consumer_type(job.spec.iteration.consumer.type).factory
    return bool(getattr(factory, "commit_timestamps", False))


def with_change_feed_times(
    spark: SparkSession, source: str, plan: IterationPlan, changes: pa.Table
) -> pa.Table:
    """``changes`` with the ``_commit_timestamp`` Spark's change feed gives each commit
    (:meth:`DeltaLogProbe.change_feed_times`), not delta-rs's: a consumer that
    publishes or sequences by it writes the same on both paths."""
    import pyarrow as pa

    assert plan.from_version is not None
    times = DeltaLogProbe(spark).change_feed_times(source, plan.from_version + 1, plan.to_version)
    if times is None:
        raise NativeReadFailed("a commit file of the range is gone")
    column = changes.schema.get_field_index("_commit_timestamp")
    stamps = pa.array(
        [times[int(v)] for v in changes["_commit_version"].to_pylist()], pa.timestamp("ms")
    )
    return changes.set_column(
        column, changes.schema.field(column), stamps.cast(changes.schema.field(column).type)
    )


def _context(
    spark: SparkSession,
    job: MemberJob,
    tables: Tables,
    settings: NativeSettings,
    token: CancelToken | None,
    rows: int,
    columns: tuple[str, ...] = (),
) -> ConsumerContext:
    return member_context(
        spark,
        job,
        tables,
        token,
        source_columns=columns,
        change_rows=rows,
        small=True,
        storage=settings.storage,
    )
