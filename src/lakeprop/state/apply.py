"""The change log applied to catalog rows: pure, no Spark.

:func:`decode_all` decodes a micro-batch's messages, a verdict for each that
does not decode; :func:`apply_commands` takes catalog rows and decoded
commands and returns the
rows to upsert and a verdict per command, in log order; :func:`apply_tasks`
does the same for the commands of bulk tasks. One handler per operation
(:data:`_HANDLERS`). A command at or below the coordinates a row records has
been applied already and is skipped, and a replayed command keeps the verdict
it got the first time, so applying a batch again changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lakeprop.changelog import JOB_PARTITION, BulkCommand, Command, LogRecord, Operation, decode
from lakeprop.errors import (
    ErrorCode,
    InvalidMessageError,
    LakepropError,
    PipelineError,
    SourceTableError,
)
from lakeprop.pipeline.graph import Graph, describe_cycle, table_of
from lakeprop.spec import JobKey, JobRef, JobSpec, merge_spec
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Coordinates, Outcome, RecordedVerdict, Verdict
from lakeprop.state.status import EMPTY_STATUS, JobState
from lakeprop.tenants import Census, Tenants


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


def decode_all(
    records: Sequence[LogRecord], max_bytes: int
) -> tuple[list[Command | BulkCommand], list[Verdict]]:
    """Decode every record; invalid ones become rejected verdicts."""
    commands: list[Command | BulkCommand] = []
    rejected: list[Verdict] = []
    for record in records:
        try:
            commands.append(decode(record, max_bytes))
        except InvalidMessageError as exc:
            rejected.append(Verdict.undecodable(record, exc))
    return commands, rejected


def off_the_job_partition(command: Command) -> Verdict:
    """The verdict, with ``cluster.enabled``, on a job message on another partition
    than :data:`~lakeprop.changelog.JOB_PARTITION` that is neither in the rows nor
    recorded (one applied before this rule keeps its verdict on replay).

    Every instance applies every message, each in its own micro-batches, and the
    pipeline graph's verdicts (a cycle, a second writer, readers left behind) depend
    on the messages before: only one partition gives every instance the same
    "before". The rejection depends on the message alone, so it is the same
    everywhere too (decision 0012)."""
    record = command.record
    return Verdict.of(
        command,
        Outcome.REJECTED,
        f"a job message on partition {record.partition} of {record.topic}: with "
        f"cluster.enabled every job message goes to partition {JOB_PARTITION}, so that "
        "every instance decides the pipeline graph in one order (the client and the "
        "CLI do so; another producer must set the partition)",
        error_code=ErrorCode.OFF_THE_JOB_PARTITION,
    )


def not_in_cluster(command: BulkCommand) -> Verdict:
    """The verdict on a bulk message read by a service with ``cluster.enabled``."""
    return Verdict.of(
        command,
        Outcome.REJECTED,
        "bulk operations are not run by a service with cluster.enabled; "
        "send one change log message per job instead",
        error_code=ErrorCode.BULK_IN_CLUSTER,
    )


ALREADY_PAUSED, NOT_PAUSED = "already paused", "not paused"
"""The details of the applied verdicts that change no catalog row: every other
applied job message writes the row of its job, with the message's coordinates."""


def _already_applied(rows: Sequence[CatalogRow], record: LogRecord) -> bool:
    return any(r.shows(record.partition, record.offset) for r in rows)


@dataclass
class _Applying:
    """The state of one :func:`apply_commands` call, shared by the operation handlers."""

    by_key: dict[JobKey, list[CatalogRow]]
    check: SourceCheck
    tenants: Tenants
    result: ApplyResult = field(default_factory=ApplyResult)
    _census: Census | None = None
    _graph: Graph | None = None

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

    @property
    def graph(self) -> Graph:
        """The live jobs' pipeline graph, built once per :func:`apply_commands` call
        and kept current as its commands apply."""
        if self._graph is None:
            self._graph = Graph.of(
                r.node for rows in self.by_key.values() for r in rows if r.is_live
            )
        return self._graph

    def acyclic(self, key: JobKey, spec: JobSpec) -> None:
        """Raise when ``key`` with ``spec`` would read, through other jobs, what it writes."""
        cycle = self.graph.cycle_with(key, spec)
        if cycle is not None:
            raise PipelineError(
                f"job {key} would make a cycle: {describe_cycle(cycle, self.graph, spec)}; "
                "a job may not read, through other jobs, the table it writes"
            )

    def sole_writer(self, key: JobKey, spec: JobSpec) -> None:
        """Raise when another live job writes the table ``key`` with ``spec`` would
        write: each snapshot of one would overwrite the other's rows."""
        others = self.graph.other_writers(key, spec)
        if others:
            database, table = self.graph.node_for(key, spec).target or ("", "")
            raise PipelineError(
                f"job {key} would write {database}.{table}, the target of job {others[0]}; "
                "each target has one writer: give this job another target_table, "
                f"or unregister {others[0]} first",
                ErrorCode.TARGET_TAKEN,
            )

    def keeps_readers(self, key: JobKey, spec: JobSpec) -> None:
        """Raise when ``key`` with ``spec`` would stop writing a table other jobs of its
        account read (another target, or none: a Kafka feed), as an unregister of it
        would. Other accounts' readers keep reading the table as it was left."""
        old = self.graph.nodes.get(key)
        if old is None or old.target is None or self.graph.node_for(key, spec).target == old.target:
            return
        readers = [k for k in self.graph.downstream(key) if k.account_id == key.account_id]
        if readers:
            raise PipelineError(
                f"job {key} would stop writing {old.target[0]}.{old.target[1]}, which "
                f"{len(readers)} job(s) read: {', '.join(map(str, readers))}; "
                "unregister or re-point them first",
                ErrorCode.DOWNSTREAM_JOBS,
            )

    def checked(self, key: JobKey, spec: JobSpec) -> str:
        """The source's identity (:data:`SourceCheck`). A missing source that a live job
        writes is that job's target before its first snapshot: the error says so."""
        try:
            return self.check(key, spec)
        except SourceTableError as exc:
            writers = self.graph.writers(table_of(key.database, key.table))
            if exc.code != ErrorCode.SOURCE_NOT_DELTA or not writers:
                raise
            raise SourceTableError(
                f"{exc}; it is the target of job {writers[0]}, which has not written it "
                "yet: register this job once that one has its first snapshot",
                exc.code,
            ) from None

    def verdict(self, cmd: Command, outcome: Outcome, detail: str, **kw: Any) -> None:
        self.result.verdicts.append(Verdict.of(cmd, outcome, detail, **kw))

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
        ctx.acyclic(cmd.key, cmd.spec)
        ctx.sole_writer(cmd.key, cmd.spec)
    table_id = prior.table_id if prior and prior.table_id else ctx.checked(cmd.key, cmd.spec)
    ctx.census.add(cmd.key, cmd.spec)
    ctx.graph.add(cmd.key, cmd.spec)
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
    below = ctx.graph.below(live.key, account=live.key.account_id)
    if prior is None and below and not cmd.cascade:
        raise PipelineError(
            f"job {live.key} has {len(below)} job(s) downstream, reading its target: "
            f"{', '.join(map(str, below))}; "
            "unregister them first, or send the unregister with cascade to drop them too",
            ErrorCode.DOWNSTREAM_JOBS,
        )
    # jobs of other accounts are dropped by their own accounts only: they keep reading
    # the tables as the dropped jobs left them (an account never holds another's up)
    foreign = {
        k
        for job in (live.key, *(below if cmd.cascade else ()))
        for k in ctx.graph.downstream(job)
        if k.account_id != live.key.account_id
    }
    ctx.put_touched(replace(live, drop_at=cmd.record.timestamp), cmd)
    dropped = [live]
    if cmd.cascade:  # the downstream rows keep their own messages' coordinates
        for key in below:
            row = next(r for r in ctx.by_key[key] if r.is_live)
            ctx.put(replace(row, drop_at=cmd.record.timestamp))
            dropped.append(row)
    for row in dropped:
        ctx.census.remove(row.key)
        ctx.graph.remove(row.key)
        ctx.result.cancel.add(row.row_id)
    detail = "unregistered"
    if len(dropped) > 1:
        detail += f" with {len(dropped) - 1} job(s) downstream: " + ", ".join(
            str(r.key) for r in dropped[1:]
        )
    if foreign:
        detail += (
            f"; {len(foreign)} job(s) of other accounts read what it wrote, and keep "
            "reading it as it stands"
        )
    ctx.verdict(cmd, Outcome.APPLIED, detail, job_id=live.job_id)


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
        old = ctx.graph.nodes.get(cmd.key)
        keeps = old is not None and old.target == ctx.graph.node_for(cmd.key, merged).target
        ctx.tenants.admit(cmd.key, merged, ctx.census, new_job=False, keeps_target=keeps)
        ctx.acyclic(cmd.key, merged)
        if not keeps:  # a job keeps the target it has (a catalog may hold an old collision)
            ctx.sole_writer(cmd.key, merged)
        ctx.keeps_readers(cmd.key, merged)
        ctx.check(cmd.key, merged)
    ctx.graph.add(cmd.key, merged)
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
        ctx.verdict(cmd, Outcome.APPLIED, ALREADY_PAUSED, job_id=live.job_id)
        return
    ctx.put_touched(replace(live, job_state=JobState.PAUSED), cmd)
    ctx.result.cancel.add(live.row_id)
    ctx.verdict(cmd, Outcome.APPLIED, "paused", job_id=live.job_id)


def _resume(
    ctx: _Applying, cmd: Command, live: CatalogRow | None, prior: RecordedVerdict | None
) -> None:
    assert live is not None
    if live.job_state != JobState.PAUSED:
        ctx.verdict(cmd, Outcome.APPLIED, NOT_PAUSED, job_id=live.job_id)
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
    # the source as it is now: a table re-created at the same path is followed from here
    table_id = prior.table_id if prior and prior.table_id else ctx.check(cmd.key, live.spec())
    resynced = replace(
        live,
        job_spec=JobSpec.from_json(spec).canonical(),
        table_id=table_id,
        watermark=None,
        watermark_ts=None,
        job_state=state,
    )
    ctx.put_touched(resynced, cmd)
    ctx.result.cancel.add(live.row_id)
    ctx.verdict(
        cmd, Outcome.APPLIED, "resync from a snapshot", job_id=live.job_id, table_id=table_id
    )


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
    one_partition: bool = False,
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

    ``one_partition`` (``cluster.enabled``): a new job message off the job partition
    is rejected (:func:`off_the_job_partition`).
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
        if one_partition and prior is None and cmd.record.partition != JOB_PARTITION:
            ctx.result.verdicts.append(off_the_job_partition(cmd))
            continue
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
