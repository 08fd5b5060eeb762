"""The job catalog: one Delta row per job, modelled on ``mo_iscp_log``.

Columns follow MatrixOne's ``mo_iscp_log`` (account id, table identity, job name, job id, job spec,
job state, watermark, job status, create and drop time) plus the Kafka
coordinates of the last change log message applied to the row, which is what
makes applying the log idempotent: a message at or below those coordinates has
already been applied and is skipped.

:func:`apply_commands` is the pure heart of it (no Spark): catalog rows and
decoded commands in, the rows to upsert and a verdict per command out.
:class:`JobCatalog` keeps the rows in memory and writes changes to Delta.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakeprop.changelog import Command, LogRecord, Operation
from lakeprop.errors import LakepropError
from lakeprop.spec import JobKey, JobRef, JobSpec, merge_spec
from lakeprop.state import store as state
from lakeprop.state.outcomes import Coordinates, Outcome, RecordedVerdict, Verdict
from lakeprop.state.status import EMPTY_STATUS, JobState
from lakeprop.tenants import Census, Tenants

log = logging.getLogger(__name__)

CATALOG_SCHEMA = StructType(
    [
        StructField("account_id", LongType(), False),
        StructField("database", StringType(), False),
        StructField("table", StringType(), False),
        StructField("job_name", StringType(), False),
        StructField("job_id", LongType(), False),
        StructField("table_id", StringType(), False),
        StructField("job_spec", StringType(), False),
        StructField("job_state", StringType(), False),
        StructField("watermark", LongType(), True),
        StructField("watermark_ts", TimestampType(), True),
        StructField("job_status", StringType(), False),
        StructField("create_at", TimestampType(), False),
        StructField("drop_at", TimestampType(), True),
        StructField("owner", StringType(), True),
        StructField("log_partition", IntegerType(), False),
        StructField("log_offset", LongType(), False),
    ]
)


@dataclass(frozen=True)
class CatalogRow:
    """One job as stored in the catalog (field order = CATALOG_SCHEMA)."""

    account_id: int
    database: str
    table: str
    job_name: str
    job_id: int
    table_id: str
    job_spec: str
    job_state: JobState
    watermark: int | None
    """Delta version of the source up to which the job has consumed changes."""
    watermark_ts: datetime | None
    job_status: str
    create_at: datetime
    drop_at: datetime | None
    owner: str | None
    log_partition: int
    log_offset: int

    @property
    def key(self) -> JobKey:
        return JobKey(self.account_id, self.database, self.table, self.job_name)

    @property
    def row_id(self) -> JobRef:
        return (self.key, self.job_id)

    @property
    def is_live(self) -> bool:
        return self.drop_at is None

    def spec(self) -> JobSpec:
        return JobSpec.from_json(json.loads(self.job_spec))

    def consumer_spec(self) -> str:
        """Canonical JSON of the job's consumer (type and options)."""
        return self.spec().iteration.consumer.canonical()

    def as_tuple(self) -> tuple[Any, ...]:
        values = {f.name: getattr(self, f.name) for f in CATALOG_SCHEMA.fields}
        values["job_state"] = self.job_state.value
        return tuple(values.values())

    @classmethod
    def from_spark(cls, row: Any) -> CatalogRow:
        values = {f.name: row[f.name] for f in CATALOG_SCHEMA.fields}
        values["job_state"] = JobState(values["job_state"])
        return cls(**values)

    def touched_by(self, record: LogRecord) -> CatalogRow:
        return replace(self, log_partition=record.partition, log_offset=record.offset)


def job_id_for(record: LogRecord) -> int:
    """Deterministic, unique job id from the register message's coordinates.

    A replay of the register produces the same id; a re-register after an
    unregister is a later message and so gets a new id, as ISCP requires.
    """
    return (record.partition << 40) | record.offset


SourceCheck = Callable[[JobKey, JobSpec], str]
"""Checks a spec against its source table; returns the table's identity or raises."""


@dataclass
class ApplyResult:
    upserts: dict[JobRef, CatalogRow] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    cancel: set[JobRef] = field(default_factory=set)
    """Jobs whose queued or running iteration must stop: dropped, interrupted by an
    update, or given a new consumer (which restarts them from a snapshot)."""
    temporary: dict[str, str] = field(default_factory=dict)
    """Bulk tasks that hit a temporary error (task -> reason): tried again later."""


def _already_applied(rows: Sequence[CatalogRow], record: LogRecord) -> bool:
    return any(r.log_partition == record.partition and r.log_offset >= record.offset for r in rows)


def _verdict(cmd: Command, outcome: Outcome, detail: str, **kw: Any) -> Verdict:
    return Verdict(
        record=cmd.record,
        outcome=outcome,
        request_id=cmd.request_id,
        op=cmd.op.value,
        key=cmd.key,
        detail=detail,
        **kw,
    )


@dataclass
class _Applying:
    """The state of one :func:`apply_commands` call, shared by the operation handlers."""

    by_key: dict[JobKey, list[CatalogRow]]
    check: SourceCheck
    tenants: Tenants
    result: ApplyResult = field(default_factory=ApplyResult)
    _census: Census | None = None

    def put(self, row: CatalogRow) -> None:
        existing = [r for r in self.by_key.get(row.key, []) if r.job_id != row.job_id]
        self.by_key[row.key] = [*existing, row]
        self.result.upserts[row.row_id] = row

    @property
    def census(self) -> Census:
        """The live jobs' accounts and tables, counted once per call of
        :func:`apply_commands` and kept current as its commands apply."""
        if self._census is None:
            self._census = Census.of(
                (r.key, r.spec()) for rows in self.by_key.values() for r in rows if r.is_live
            )
        return self._census

    def verdict(self, cmd: Command, outcome: Outcome, detail: str, **kw: Any) -> None:
        self.result.verdicts.append(_verdict(cmd, outcome, detail, **kw))

    def put_touched(self, row: CatalogRow, cmd: Command) -> None:
        """Put a row a command changed. It records the message's coordinates (what
        makes a replay skip it), unless a bulk task changed it: the row keeps those
        of its own last message, which a later bulk message does not follow."""
        self.put(row if cmd.task else row.touched_by(cmd.record))


def _register(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert cmd.spec is not None
    if live is not None:
        ctx.verdict(
            cmd,
            Outcome.ALREADY_EXISTS,
            f"job {cmd.key} already exists (job id {live.job_id})",
            job_id=live.job_id,
        )
        return
    if prior is None:  # a replay keeps the verdict it got, whatever changed since
        ctx.tenants.admit(cmd.key, cmd.spec, ctx.census, new_job=True)
    table_id = prior.table_id if prior and prior.table_id else ctx.check(cmd.key, cmd.spec)
    ctx.census.add(cmd.key, cmd.spec)
    new = CatalogRow(
        account_id=cmd.key.account_id,
        database=cmd.key.database,
        table=cmd.key.table,
        job_name=cmd.key.job_name,
        job_id=cmd.job_id if cmd.job_id is not None else job_id_for(cmd.record),
        table_id=table_id,
        job_spec=cmd.spec.canonical(),
        job_state=JobState.COMPLETED,
        watermark=None,
        watermark_ts=None,
        job_status=EMPTY_STATUS,
        create_at=cmd.record.timestamp,
        drop_at=None,
        owner=None,
        log_partition=cmd.record.partition,
        log_offset=cmd.record.offset,
    )
    ctx.put(new)
    ctx.verdict(cmd, Outcome.APPLIED, "registered", job_id=new.job_id, table_id=table_id)


def _unregister(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert live is not None
    ctx.put_touched(replace(live, drop_at=cmd.record.timestamp), cmd)
    ctx.census.remove(live.key)
    ctx.result.cancel.add(live.row_id)
    ctx.verdict(cmd, Outcome.APPLIED, "unregistered", job_id=live.job_id)


def _update_spec(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert live is not None
    if cmd.spec is not None:  # a bulk rollback restores the spec a task replaced
        merged = cmd.spec
    else:
        assert cmd.spec_update is not None
        merged = JobSpec.from_json(merge_spec(json.loads(live.job_spec), cmd.spec_update))
    if prior is None:
        ctx.tenants.admit(cmd.key, merged, ctx.census, new_job=False)
        ctx.check(cmd.key, merged)
    updated = replace(live, job_spec=merged.canonical())
    if updated.consumer_spec() != live.consumer_spec():
        updated = replace(updated, watermark=None, watermark_ts=None)
        ctx.result.cancel.add(live.row_id)
    if cmd.interrupt:
        ctx.result.cancel.add(live.row_id)
    if live.job_state == JobState.ERROR:
        updated = replace(updated, job_state=JobState.COMPLETED)
    ctx.put_touched(updated, cmd)
    ctx.verdict(cmd, Outcome.APPLIED, "spec updated", job_id=live.job_id)


def _pause(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert live is not None
    if live.job_state == JobState.PAUSED:
        ctx.verdict(cmd, Outcome.APPLIED, "already paused", job_id=live.job_id)
        return
    ctx.put_touched(replace(live, job_state=JobState.PAUSED), cmd)
    ctx.result.cancel.add(live.row_id)
    ctx.verdict(cmd, Outcome.APPLIED, "paused", job_id=live.job_id)


def _resume(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert live is not None
    if live.job_state != JobState.PAUSED:
        ctx.verdict(cmd, Outcome.APPLIED, "not paused", job_id=live.job_id)
        return
    ctx.put_touched(replace(live, job_state=JobState.COMPLETED), cmd)
    ctx.verdict(cmd, Outcome.APPLIED, "resumed", job_id=live.job_id)


def _resync(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert live is not None
    state = JobState.PAUSED if live.job_state == JobState.PAUSED else JobState.COMPLETED
    spec = live.spec().to_json()
    consumer = spec["iteration"]["consumer"]
    consumer["generation"] = consumer.get("generation", 0) + 1  # a new consumer: no progress
    resynced = replace(
        live,
        job_spec=JobSpec.from_json(spec).canonical(),
        watermark=None,
        watermark_ts=None,
        job_state=state,
    )
    ctx.put_touched(resynced, cmd)
    ctx.result.cancel.add(live.row_id)
    ctx.verdict(cmd, Outcome.APPLIED, "resync from a snapshot", job_id=live.job_id)


_Handler = Callable[[_Applying, Command, "CatalogRow | None", "RecordedVerdict | None"], None]

_HANDLERS: dict[Operation, _Handler] = {
    Operation.REGISTER: _register,
    Operation.UNREGISTER: _unregister,
    Operation.UPDATE_SPEC: _update_spec,
    Operation.PAUSE: _pause,
    Operation.RESUME: _resume,
    Operation.RESYNC: _resync,
}
"""How each operation changes the catalog."""

_NEEDS_LIVE_JOB = frozenset(set(Operation) - {Operation.REGISTER})


def apply_commands(
    rows: Iterable[CatalogRow],
    commands: Sequence[Command],
    check: SourceCheck,
    recorded: Mapping[Coordinates, RecordedVerdict] | None = None,
    tenants: Tenants | None = None,
) -> ApplyResult:
    """Apply decoded change log commands to catalog rows, in log order.

    * register creates a job (state ``completed``, no watermark); a second
      register of a live job is ``already_exists``;
    * unregister sets ``drop_at`` (the row is garbage-collected later);
    * update_spec fills the empty fields of the new spec from the current one. A new
      consumer (type or options) restarts the job from a snapshot; an update also
      repairs a job in state ``error``;
    * pause sets the state ``paused`` and stops a running iteration: the job keeps
      its watermark and runs none until resume sets it ``completed`` again, from
      where it caught up from its watermark (pause of a paused job and resume of
      a running one are applied and change nothing);
    * resync clears the watermark, bumps the consumer's ``generation`` (so no
      earlier progress in the history counts for it, after a restart either) and
      stops a running iteration: the next iteration is a snapshot at the
      source's current version, then tails follow (a paused job stays paused; an
      ``error`` is repaired).

    ``tenants`` admits registers and updates: an account over its live-job quota,
    outside its scope, or writing another account's tables is rejected (open by
    default).

    Commands already reflected in the rows are skipped. A command with a
    ``recorded`` verdict (a replay) gets that verdict again instead of being
    re-checked against the source table, whose state may have moved on.
    """
    recorded = recorded or {}
    by_key: dict[JobKey, list[CatalogRow]] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    ctx = _Applying(by_key, check, tenants or Tenants())
    ordered = sorted(commands, key=lambda c: (c.record.topic, c.record.partition, c.record.offset))
    for cmd in ordered:
        current = by_key.get(cmd.key, [])
        prior = recorded.get((cmd.record.topic, cmd.record.partition, cmd.record.offset))
        if _already_applied(current, cmd.record) or (
            prior is not None and prior.outcome is not Outcome.APPLIED
        ):
            continue  # in the rows already, or its verdict is recorded and it changed nothing
        _apply_one(ctx, cmd, prior)
    return ctx.result


def _apply_one(ctx: _Applying, cmd: Command, prior: RecordedVerdict | None) -> None:
    live = next((r for r in ctx.by_key.get(cmd.key, []) if r.is_live), None)
    if live is None and cmd.op in _NEEDS_LIVE_JOB:
        ctx.verdict(cmd, Outcome.NOT_FOUND, f"no live job {cmd.key}")
        return
    try:
        _HANDLERS[cmd.op](ctx, cmd, live, prior)
    except LakepropError as exc:
        if exc.is_temporary:
            raise
        ctx.verdict(cmd, Outcome.REJECTED, str(exc), error_code=exc.code)


def apply_tasks(
    rows: Iterable[CatalogRow],
    commands: Sequence[Command],
    check: SourceCheck,
    tenants: Tenants | None = None,
) -> ApplyResult:
    """Apply the commands of bulk tasks (:attr:`Command.task` set), in order, through
    the same handlers as the change log's: a verdict per command, except for
    those that hit a temporary error (:attr:`ApplyResult.temporary`), which
    change nothing."""
    by_key: dict[JobKey, list[CatalogRow]] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    ctx = _Applying(by_key, check, tenants or Tenants())
    for cmd in commands:
        assert cmd.task is not None
        before = dict(ctx.result.upserts)
        try:
            _apply_one(ctx, cmd, None)
        except LakepropError as exc:  # temporary: undo nothing, it changed nothing
            ctx.result.upserts = before
            ctx.result.temporary[cmd.task] = str(exc)
    return ctx.result


@dataclass
class _Flush:
    """A flush writing on a thread of its own (see :meth:`JobCatalog.flush_in_background`)."""

    base: int
    """The catalog's write count when its content was taken."""
    content: dict[JobRef, CatalogRow]
    rows: dict[JobRef, CatalogRow]
    """The rows it writes that memory held only."""
    thread: threading.Thread | None = None
    written_as: int | None = None
    """Its write's number; None when it did not write (a later content went first)."""
    error: BaseException | None = None


class JobCatalog:
    """The catalog rows in memory, backed by a Delta table (the durable truth).

    Only the micro-batch thread changes it; a status flush may write the table
    from a thread of its own (:meth:`flush_in_background`), never its memory.
    Changes that must be durable (the change log's, an error) are staged in
    memory and written with one commit at the end of the micro-batch
    (:meth:`commit_staged`); if that write fails the query fails and a restart
    reloads the table. Changes that need not be
    durable at once stay in memory until :meth:`flush`, as ISCP's in-memory
    watermark does: a fresh watermark time of an idle job, a transient state,
    and an advanced watermark, whose durable record is the iteration history
    (:meth:`remember` with ``progress``). Every write is of the whole table, so
    a commit takes along whatever memory holds.
    """

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self._rows: dict[JobRef, CatalogRow] = {}
        self._durable: dict[JobRef, CatalogRow] = {}
        """The rows as the Delta table holds them."""
        self._dirty: set[JobRef] = set()
        self._progress: set[JobRef] = set()
        """Dirty rows whose watermark or status advanced (flushed more often)."""
        self._staged: set[JobRef] = set()
        self._created = False
        self._write_lock = threading.RLock()
        self._writes = 0
        """Writes of the table so far (under the lock)."""
        self._flushing: _Flush | None = None

    def ensure(self) -> None:
        self._created = state.ensure_table(self.spark, self.path, CATALOG_SCHEMA)

    def load(self) -> None:
        """Read every row from Delta (at start-up; afterwards memory is kept in step)."""
        rows = [] if self._created else state.read_table(self.spark, self.path).collect()
        self._rows = {r.row_id: r for r in map(CatalogRow.from_spark, rows)}
        self._durable = dict(self._rows)

    def _write(self, rows: Mapping[JobRef, CatalogRow]) -> None:
        """Replace the table's content with ``rows`` in one commit.

        The catalog is one row per job, kept whole in memory, and only this
        service writes it: writing it whole is one Spark job, where a MERGE
        first reads and joins the table (and rewrites the same file anyway).
        """
        self.settle()
        self._write_table(rows)
        self._durable = dict(rows)

    def _write_table(
        self, rows: Mapping[JobRef, CatalogRow], base: int | None = None
    ) -> int | None:
        """Overwrite the table with ``rows``, one write at a time; with ``base``, only if
        no write happened since the write count was ``base`` (None then: skipped)."""
        with self._write_lock:
            if base is not None and self._writes != base:
                return None
            state.overwrite(
                self.spark, self.path, CATALOG_SCHEMA, [r.as_tuple() for r in rows.values()]
            )
            self._writes += 1
            return self._writes

    def rows(self) -> list[CatalogRow]:
        return list(self._rows.values())

    def by_id(self) -> Mapping[JobRef, CatalogRow]:
        return self._rows

    def stage(self, rows: Mapping[JobRef, CatalogRow]) -> None:
        """Change rows in memory now; :meth:`commit_staged` writes them."""
        self._rows.update(rows)
        self._staged.update(rows)

    def commit_staged(self) -> int:
        """Write the staged rows, and with them every row changed only in memory."""
        staged = {rid: self._rows[rid] for rid in self._staged if rid in self._rows}
        self._staged.clear()
        if staged:
            unflushed = {rid: self._rows[rid] for rid in self._dirty if rid in self._rows}
            self.commit({**unflushed, **staged})
        return len(staged)

    def remember(self, rows: Iterable[CatalogRow], *, progress: bool = False) -> None:
        """Change rows in memory only; :meth:`flush` writes them later.

        ``progress``: the rows carry advanced watermarks or statuses, which the
        catalog table should show sooner than idle times (:attr:`behind`).
        """
        for row in rows:
            self._rows[row.row_id] = row
            self._dirty.add(row.row_id)
            if progress:
                self._progress.add(row.row_id)

    @property
    def behind(self) -> bool:
        """Whether memory holds advanced watermarks or statuses the table does not."""
        return bool(self._progress)

    def _unflushed(self) -> dict[JobRef, CatalogRow]:
        """Rows changed only in memory. A row also staged waits for
        :meth:`commit_staged`: the staged rows of a batch are one prefix of the
        change log, and writing some of them early would persist a later message
        without an earlier one (a replay then takes the earlier one as applied)."""
        return {
            rid: self._rows[rid]
            for rid in self._dirty
            if rid in self._rows and rid not in self._staged
        }

    def _await_flush(self) -> None:
        """Let a background flush end, and take in its result."""
        if self._flushing is not None and self._flushing.thread is not None:
            self._flushing.thread.join()
        self.settle()

    def flush(self) -> int:
        """Write the rows changed only in memory (after a background flush ends)."""
        self._await_flush()
        dirty = self._unflushed()
        self.commit(dirty)
        return len(dirty)

    def flush_in_background(self) -> int:
        """Start writing the rows changed only in memory on a thread of its own, so
        the micro-batch does not wait for a write of the whole table; the rows it
        writes (0: nothing to write, or a flush still runs).

        Its content is taken now. It writes only if no other write went first (a
        commit then took the rows along, as every write holds what memory does),
        and :meth:`settle` takes its result into memory on the micro-batch thread.
        A write that fails leaves the rows to the next flush: the watermarks are
        durable in the iteration history already.
        """
        self.settle()
        if self._flushing is not None:
            return 0
        rows = self._unflushed()
        if not rows:
            return 0
        flush = _Flush(self._writes, {**self._durable, **rows}, rows)

        def write() -> None:
            try:
                flush.written_as = self._write_table(flush.content, flush.base)
            except BaseException as exc:  # settled on the micro-batch thread
                flush.error = exc

        flush.thread = threading.Thread(target=write, name="lakeprop-catalog-flush", daemon=True)
        self._flushing = flush
        flush.thread.start()
        return len(rows)

    def settle(self) -> None:
        """Take in a background flush that has ended: if its write is still the
        table's latest, memory learns that its rows are durable."""
        flush = self._flushing
        if flush is None or (flush.thread is not None and flush.thread.is_alive()):
            return
        self._flushing = None
        if flush.error is not None:
            log.warning("catalog flush failed, retried at the next one: %s", flush.error)
            return
        if flush.written_as is None or flush.written_as != self._writes:
            return  # a later write holds these rows, or rewrote the table without them
        self._durable = flush.content
        done = {rid for rid, row in flush.rows.items() if self._rows.get(rid) is row}
        self._dirty -= done
        self._progress -= done

    def dropped_before(self, cutoff: datetime) -> list[JobRef]:
        """Jobs whose drop is written and older than ``cutoff`` (a staged drop is not)."""
        return [
            r.row_id
            for r in self._rows.values()
            if r.drop_at is not None and r.drop_at < cutoff and r.row_id not in self._staged
        ]

    def delete(self, row_ids: Iterable[JobRef]) -> None:
        """Remove rows (garbage collection of dropped jobs)."""
        doomed = [self._rows[rid] for rid in row_ids if rid in self._rows]
        if not doomed:
            return
        self._await_flush()  # what the table holds, with the flush's rows if it wrote
        remaining = dict(self._durable)
        for row in doomed:
            remaining.pop(row.row_id, None)
        self._write(remaining)
        for row in doomed:
            self._rows.pop(row.row_id, None)
            self._dirty.discard(row.row_id)
            self._progress.discard(row.row_id)
            self._staged.discard(row.row_id)

    def commit(self, upserts: Mapping[JobRef, CatalogRow]) -> None:
        """Write changed rows to Delta, then to memory (so a failed write changes neither)."""
        if not upserts:
            return
        self._write({**self._durable, **upserts})
        self._rows.update(upserts)
        self._dirty.difference_update(upserts)
        self._progress.difference_update(upserts)
