"""One iteration: read a table's changes once and hand them to every consumer.

A tail iteration reads the Change Data Feed of ``(from, to]`` with the end
version pinned (an open end would re-resolve "latest" at every action),
checkpoints it locally as it counts it per version (the same Spark job finds
the least and greatest value of the members' key columns, by which their MERGEs
skip target files), and gives each member its own slice (changes after that
member's watermark). In a large tail the last change per key is computed once
per key and start for the consumers that ask, and held likewise
(:class:`HeldLatest`). A snapshot iteration hands over the
table as of ``to``. When the range can no longer be read (vacuumed, past log
retention, change feed off), the iteration becomes a snapshot at the same
version: a full resync, recorded as such. Missing files are never skipped.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.changes import (
    Bounds,
    bounded_columns,
    bounds_after,
    latest_change_per_key,
)
from lakeprop.engine.failures import member_error
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    MemberJob,
    MemberResult,
    source_gone,
)
from lakeprop.engine.native import (
    NativePlan,
    NativeReadFailed,
    NativeSettings,
    plan_native,
    run_native,
)
from lakeprop.engine.sparkstats import cached_bytes, checkpointed_rdd, group_jobs, task_seconds
from lakeprop.errors import ErrorCode, LakepropError, PermanentError
from lakeprop.faults import fault_point
from lakeprop.registry import get_consumer_type
from lakeprop.tables.resolve import TableHandle, Tables

log = logging.getLogger(__name__)

_UNREADABLE_RANGE = (
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
    "DELTA_MISSING_CHANGE_DATA",
    "DELTA_CHANGE_TABLE_FEED_DISABLED",
    "DELTA_VERSIONS_NOT_CONTIGUOUS",
    "DELTA_FILE_NOT_FOUND",
    "VersionNotFoundException",
    "FileNotFoundException",
    "change data was not recorded",
    "not enabled for change data feed",
)


_SCHEMA_CHANGED = (
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE",
)
"""Delta's refusals to read a change feed across a non-additive schema change."""


def _unreadable(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in _UNREADABLE_RANGE)


def run_iteration(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    token: CancelToken,
    fan_out: int = 1,
    small_rows: int = 0,
    native: NativeSettings | None = None,
) -> IterationResult:
    """Run one iteration in the calling (worker) thread with its own session.

    A small tail goes the native way (:mod:`lakeprop.engine.native`) when
    ``native`` allows and every member can: delta-rs in the driver, no Spark job.
    Otherwise:

    The change set is read once and held (checkpointed); up to ``fan_out``
    consumers then read it at once, each in a session of its own (its Delta
    transaction confs stay apart) and in the iteration's job group (threads
    inherit it), so that cancelling the iteration reaches every consumer's
    Spark jobs. With at most
    ``small_rows`` rows read, the consumers' sessions plan without adaptive
    execution (:func:`small_confs`) and a replica's MERGE reads the change set
    without copying it (:meth:`ConsumerContext.merging_changes`).
    """
    result = IterationResult(plan=plan, kind=plan.kind, started_at=time.time())
    source = tables.handle(plan.table.database, plan.table.table, spark)
    if native is not None:
        where = plan_native(spark, plan, jobs, tables, native)
        if isinstance(where, NativePlan):
            try:
                return _natively(spark, plan, jobs, tables, token, native, where, result, source)
            except NativeReadFailed as exc:
                where = f"delta-rs could not read the changes: {exc}"
                result = IterationResult(plan=plan, kind=plan.kind, started_at=time.time())
        log.debug("iteration %s runs on Spark: %s", plan.iteration_id, where)
    data: DataFrame | None = None
    held: HeldLatest | None = None
    try:
        with session_confs(spark, COUNTING_CONFS):
            data, per_version, bounds = _read(source, plan, result, token, _key_columns(jobs))
        result.bytes_cached = cached_bytes(spark, data)
        token.cached_bytes = result.bytes_cached or 0
        fault_point("iteration.before_write")
        small = result.rows_read <= small_rows
        held = HeldLatest(data, token) if result.kind is IterationKind.TAIL and not small else None
        consume = functools.partial(
            _consume,
            kind=result.kind,
            plan=plan,
            data=data,
            per_version=per_version,
            bounds=bounds,
            small=small,
            held=held,
            tables=tables,
            token=token,
        )
        confs = small_confs(spark) if small else {}
        if fan_out > 1 and len(jobs) > 1:
            _consume_concurrently(spark, jobs, consume, result, fan_out, confs)
        else:
            with session_confs(spark, confs):
                _consume_in_turn(spark, jobs, consume, result)
        fault_point("iteration.after_writes")
    except Exception as exc:
        _fail_the_rest(result, jobs, source, exc, token)
    finally:
        if held is not None:
            result.bytes_cached = (result.bytes_cached or 0) + held.release(spark)
        if data is not None:
            _release(data)
        result.canceled = token.cancelled
        result.ended_at = time.time()
        jobs_run = group_jobs(spark, plan.iteration_id)
        result.spark_jobs = len(jobs_run)
        result.task_seconds = task_seconds(spark, jobs_run)
    return result


def _natively(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    token: CancelToken,
    settings: NativeSettings,
    where: NativePlan,
    result: IterationResult,
    source: TableHandle,
) -> IterationResult:
    result.path = "native"
    try:
        run_native(spark, plan, jobs, tables, token, settings, where, result)
    except NativeReadFailed:
        raise
    except Exception as exc:
        _fail_the_rest(result, jobs, source, exc, token)
    finally:
        result.canceled = token.cancelled
        result.ended_at = time.time()
        jobs_run = group_jobs(spark, plan.iteration_id)
        result.spark_jobs = len(jobs_run)
        # the driver did the work: its time is what the iteration cost (usage, budgets)
        driver = result.ended_at - result.started_at
        result.task_seconds = (task_seconds(spark, jobs_run) or 0.0) + driver
    return result


Consume = Callable[[SparkSession, MemberJob], MemberResult]


def _consume_in_turn(
    spark: SparkSession, jobs: Sequence[MemberJob], consume: Consume, result: IterationResult
) -> None:
    for i, job in enumerate(jobs):
        if i:
            fault_point("iteration.between_consumers")
        result.members.append(consume(spark, job))
        if i == 0 and result.kind is IterationKind.SNAPSHOT:
            fault_point("iteration.snapshot")


def _consume_concurrently(
    spark: SparkSession,
    jobs: Sequence[MemberJob],
    consume: Consume,
    result: IterationResult,
    fan_out: int,
    confs: Mapping[str, str],
) -> None:
    """Members on up to ``fan_out`` threads; results in member order. The
    ``iteration.between_consumers`` point fires once the first member has
    written while another has not finished."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(jobs)):
        todo.put(i)
    finished: queue.Queue[int] = queue.Queue()
    done: dict[int, MemberResult] = {}

    def work(session: SparkSession) -> None:
        with session_confs(session, confs):
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    done[i] = consume(session, jobs[i])
                finally:
                    finished.put(i)

    threads = [
        InheritableThread(target=work, args=(session,), name=f"lakeprop-consumer-{n}", daemon=True)
        for n, session in enumerate(consumer_sessions(spark, min(fan_out, len(jobs))))
    ]
    for thread in threads:
        thread.start()
    try:
        finished.get()
        if len(jobs) > 1:
            fault_point("iteration.between_consumers")
    finally:
        for thread in threads:
            thread.join()
        result.members += [done[i] for i in sorted(done)]


COUNTING_CONFS = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "1"}
"""While the change set is stored and counted per commit version: the count's
shuffle carries one row per version, so one reduce task and no adaptive
re-planning (which runs each stage as a job of its own) suit it at any size."""


def small_confs(spark: SparkSession) -> dict[str, str]:
    """Session confs for consumers of a small change set: no adaptive execution
    (each shuffle stage of a MERGE would be a Spark job of its own), and as many
    shuffle partitions as the cluster has cores by default, not 200."""
    return {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": str(max(1, spark.sparkContext.defaultParallelism)),
    }


@contextmanager
def session_confs(session: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """``confs`` set on ``session`` (a worker's or a consumer's own) for the block,
    then each back to what it was."""
    before: dict[str, str | None] = {key: session.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key, earlier in before.items():
            if earlier is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, earlier)


_SESSIONS: weakref.WeakKeyDictionary[SparkSession, list[SparkSession]] = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def consumer_sessions(spark: SparkSession, count: int) -> list[SparkSession]:
    """``count`` sessions of the worker session ``spark``'s own, made once and reused."""
    with _SESSIONS_LOCK:
        sessions = _SESSIONS.setdefault(spark, [])
        while len(sessions) < count:
            sessions.append(spark.newSession())
        return sessions[:count]


def _key_columns(jobs: Sequence[MemberJob]) -> list[str]:
    """The key columns the members' consumer types name (``Consumer.key_columns``),
    each once. A type that cannot say names none: its member fails on its own."""
    columns: list[str] = []
    for job in jobs:
        consumer = job.spec.iteration.consumer
        try:
            named = get_consumer_type(consumer.type).key_columns(consumer.options)
        except Exception as exc:
            log.debug("no key columns of %s for job %s: %s", consumer.type, job.key, exc)
            continue
        columns += [c for c in named if c not in columns]
    return columns


def _read(
    source: TableHandle,
    plan: IterationPlan,
    result: IterationResult,
    token: CancelToken,
    keys: Sequence[str],
) -> tuple[DataFrame, dict[int, int], dict[int, Bounds]]:
    """The checkpointed change set of a tail, with its rows per commit version
    and the bounds of the ``keys`` it can bound per version (one Spark job
    finds both as it stores the blocks), or the table as of ``to_version`` for
    a snapshot (no counts, no bounds); a tail whose range is no longer readable
    becomes a snapshot (resync)."""
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
            counted = (
                data.groupBy("_commit_version").agg(F.count(F.lit(1)).alias("_rows"), *extremes)
            ).collect()
            per_version = {int(r["_commit_version"]): int(r["_rows"]) for r in counted}
            bounds: dict[int, Bounds] = {
                int(r["_commit_version"]): {
                    c.lower(): (r[f"_low{i}"], r[f"_high{i}"]) for i, c in enumerate(bounded)
                }
                for r in counted
            }
            result.rows_read = token.cached_rows = sum(per_version.values())
            return data, per_version, bounds
        except Exception as exc:
            if data is not None:
                _release(data)
            if not token.cancelled and any(m in str(exc) for m in _SCHEMA_CHANGED):
                raise schema_change(source, plan) from None
            if token.cancelled or not _unreadable(exc):
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
    return snapshot, {}, {}


def schema_change(source: TableHandle, plan: IterationPlan) -> PermanentError:
    """What changed in the source's columns over a range whose change feed Delta will
    not read: a permanent error saying so (a resync rebuilds from the source as it is)."""
    assert plan.from_version is not None

    def fields(version: int) -> dict[str, str]:
        schema = source.load(source.reader().option("versionAsOf", version)).schema
        return {f.name: f.dataType.simpleString() for f in schema.fields}

    before, after = fields(plan.from_version), fields(plan.to_version)
    what = []
    dropped = [c for c in before if c not in after]
    if dropped:
        what.append(f"it no longer has column(s) {dropped}")
    changed = [
        f"{c} {before[c]} -> {after[c]}" for c in before if c in after and before[c] != after[c]
    ]
    if changed:
        what.append(f"column type(s) changed: {changed}")
    added = [c for c in after if c not in before]
    if added:
        what.append(f"new column(s) {added}")
    return PermanentError(
        f"source {source} changed its columns between versions {plan.from_version} and "
        f"{plan.to_version} in a way its change feed cannot be read across: "
        f"{'; '.join(what) or 'its column mapping changed'}; resync the job to rebuild it "
        "from the source as it is now",
        ErrorCode.SOURCE_SCHEMA_CHANGED,
    )


def _fail_the_rest(
    result: IterationResult,
    jobs: Sequence[MemberJob],
    source: TableHandle,
    exc: Exception,
    token: CancelToken,
) -> None:
    """Members that did not run get the iteration's error (the source's, if it went)."""
    code, message = member_error(exc, token)
    if not token.cancelled and not source.exists():
        code, message = int(ErrorCode.SOURCE_NOT_DELTA), source_gone(source)
    done = {m.job_id for m in result.members}
    result.members += [
        MemberResult(
            j.member.ref,
            j.member.job_id,
            j.spec.iteration.consumer.type,
            0,
            code,
            message,
            j.spec.iteration.consumer.canonical(),
        )
        for j in jobs
        if j.member.job_id not in done
    ]


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
            _release(held)
        self._held.clear()
        return taken


def _release(data: DataFrame) -> None:
    """Free the blocks of a checkpointed change set or snapshot."""
    try:
        rdd = checkpointed_rdd(data)
    except Exception as exc:  # no JVM plan to look at: unpersist is all there is
        log.debug("checkpoint of the change set not found: %s", exc)
        rdd = None
    if rdd is None:
        data.unpersist()
    else:
        rdd.unpersist(False)


def _consume(
    spark: SparkSession,
    job: MemberJob,
    *,
    kind: IterationKind,
    plan: IterationPlan,
    data: DataFrame,
    per_version: dict[int, int],
    bounds: dict[int, Bounds],
    small: bool,
    held: HeldLatest | None,
    tables: Tables,
    token: CancelToken,
) -> MemberResult:
    consumer_info = job.spec.iteration.consumer
    result = MemberResult(
        job.member.ref,
        job.member.job_id,
        consumer_info.type,
        consumer_spec=consumer_info.canonical(),
    )
    if token.cancelled:
        result.error_code, result.error_msg = int(token.code), token.reason
        return result
    tail_from = job.member.from_version if kind is IterationKind.TAIL else None
    context = ConsumerContext(
        spark=spark,
        key=job.key,
        job_id=job.member.job_id,
        consumer_type=consumer_info.type,
        options=consumer_info.options,
        generation=consumer_info.generation,
        source_columns=tuple(
            c for c in data.columns if not c.startswith("_commit") and c != "_change_type"
        ),
        locate=lambda database, table: tables.handle(database, table, spark),
        cancelled=lambda: token.cancelled,
        change_rows=(
            None if tail_from is None else sum(n for v, n in per_version.items() if v > tail_from)
        ),
        key_bounds=None if tail_from is None else bounds_after(bounds, tail_from),
        small=small,
        held_latest=(
            functools.partial(held.after, job.member.from_version)
            if held is not None and job.member.from_version is not None
            else None
        ),
    )
    try:
        consumer = get_consumer_type(consumer_info.type).factory(context)
        if kind is IterationKind.SNAPSHOT:
            result.rows_written = consumer.snapshot(data, plan.to_version)
        else:
            start = job.member.from_version
            assert start is not None
            changes = data.where(F.col("_commit_version") > start)
            result.rows_written = consumer.apply_changes(changes, start, plan.to_version)
    except Exception as exc:
        result.error_code, result.error_msg = member_error(exc, token)
        log.warning(
            "job %s (%s) failed in iteration %s: [%s] %s",
            job.key,
            consumer_info.type,
            plan.iteration_id,
            result.error_code,
            result.error_msg,
        )
    return result


def iteration_work(
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    fan_out: int = 1,
    small_rows: int = 0,
    native: NativeSettings | None = None,
) -> Callable[[SparkSession, CancelToken], IterationResult]:
    """The scheduler's work for ``plan``: run it with the worker's session."""

    def work(session: SparkSession, token: CancelToken) -> IterationResult:
        return run_iteration(session, plan, jobs, tables, token, fan_out, small_rows, native)

    return work
