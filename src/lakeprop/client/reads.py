"""Reading the service's state: jobs, verdicts, usage, accounts, bulk operations.

:class:`StateReader` writes each of its queries once, as data
(:class:`~lakeprop.client.scans.Query`), and runs them on a scan: Spark's
(:class:`~lakeprop.client.scans.SparkScan`, the default, for notebooks and
metastore tables) or delta-rs's (:class:`~lakeprop.client.scans.LakeScan`, no JVM:
the CLI's read verbs answer in about a second). A job's watermark is the later of
the catalog's and the one its iteration history records: the service writes the
catalog's watermarks on its status flush, the history at the end of every
iteration. Waits poll cheaply (:func:`poll_until`): a state table is read again
only after a new commit to it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from lakeprop.bulk.model import BulkOperation, BulkTask
from lakeprop.changelog import Operation
from lakeprop.client.lake import storage_of
from lakeprop.client.log import Receipt
from lakeprop.client.scans import Condition, LakeScan, Query, Scan, SparkScan, eq
from lakeprop.client.views import BulkStatus, JobInfo, by_key, current_row
from lakeprop.client.waiting import Progress, TableWatch, poll_until
from lakeprop.config import AppConfig, StateConfig, TablesConfig
from lakeprop.errors import (
    ErrorCode,
    InvalidConfigError,
    InvalidSpecError,
    PermanentError,
    SourceTableError,
    StateNotFoundError,
)
from lakeprop.pipeline.graph import Graph
from lakeprop.spec import JobKey
from lakeprop.state.accounts import AccountRow
from lakeprop.state.apply import ALREADY_PAUSED, NOT_PAUSED
from lakeprop.state.history import Reached, rolled_forward
from lakeprop.state.job_row import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.status import JobState
from lakeprop.state.store import (
    ACCOUNTS_TABLE,
    BULK_OPERATIONS_TABLE,
    BULK_TASKS_TABLE,
    CATALOG_TABLE,
    HISTORY_TABLE,
    REQUESTS_TABLE,
    USAGE_TABLE,
)
from lakeprop.state.usage import UsageRow, hour_of

LATEST = "latest"
"""``wait_for_watermark``'s version meaning the source table's current version."""

T = TypeVar("T")


class StateReader:
    """The state tables' reader, bound to one service's ``state`` location, reading
    with ``scan`` (by default Spark's: ``spark``, or ``getOrCreate`` when first
    needed)."""

    def __init__(
        self,
        state_config: StateConfig | None = None,
        spark: Any = None,
        tables: TablesConfig | None = None,
        *,
        scan: Scan | None = None,
    ) -> None:
        self.state = state_config or StateConfig()
        self.tables = tables
        """How sources resolve (the service's ``tables`` settings): needed for ``latest``."""
        self.scan: Scan = scan if scan is not None else SparkScan(spark)

    @classmethod
    def without_spark(cls, config: AppConfig) -> StateReader:
        """A reader of ``config``'s service with delta-rs: no JVM (the ``native`` extra)."""
        return cls(
            config.state,
            tables=config.tables,
            scan=LakeScan(storage_of(config)),
        )

    @property
    def spark(self) -> Any:
        """The session of a Spark scan (notebooks, and the client's writes that read)."""
        if not isinstance(self.scan, SparkScan):
            raise InvalidConfigError("this state reader reads without Spark")
        return self.scan.spark

    def _path(self, name: str) -> str:
        return self.state.table_path(name)

    def _read(self, name: str, query: Query) -> list[dict[str, Any]]:
        """The rows of state table ``name`` that ``query`` selects; none when the
        service has not created it (a service of an earlier release)."""
        path = self._path(name)
        if self.scan.version(path) is None:
            return []
        return self.scan.rows(path, query)

    def _require_state(self) -> str:
        """The catalog's path, or a clear error when there is no state at all."""
        path = self._path(CATALOG_TABLE)
        if self.scan.version(path) is None:
            raise StateNotFoundError(
                f"no job catalog at {path}: the service has not run with state.location "
                f"{self.state.location} yet (or the config points elsewhere)"
            )
        return path

    def _catalog_rows(self, *where: Condition) -> list[CatalogRow]:
        path = self._require_state()
        query = Query(tuple(CATALOG_SCHEMA.fieldNames()), where)
        return [CatalogRow.from_spark(r) for r in self.scan.rows(path, query)]

    def reached(self, database: str | None = None, table: str | None = None) -> Reached:
        """Per job id and consumer digest: the highest version a successful member
        reached, and when (``IterationHistory.latest_success``)."""
        where = [eq("error_code", 0)]
        if database is not None and table is not None:
            where += [eq("database", database), eq("table", table)]
        columns = ("database", "table", "to_version", "ended_at", "members")
        runs = self._read(HISTORY_TABLE, Query(columns, tuple(where), explode="members"))
        found: dict[tuple[int, str | None], tuple[int, datetime]] = {}
        for run in runs:
            slot = (run["job_id"], run.get("consumer_digest"))
            best = found.get(slot)
            if best is None or (run["to_version"], run["ended_at"]) > best:
                found[slot] = (run["to_version"], run["ended_at"])
        return found

    def _with_progress(
        self, rows: list[CatalogRow], database: str | None = None, table: str | None = None
    ) -> list[CatalogRow]:
        """The rows with the watermarks the iteration history records, where ahead."""
        if not any(r.is_live for r in rows):
            return rows
        reached = self.reached(database, table)
        return [rolled_forward(r, reached) or r for r in rows]

    def get_job_status(self, key: JobKey, *, waiting: bool = True) -> JobInfo | None:
        """The live job with this key, or else its most recently dropped one.

        ``waiting=False`` leaves :attr:`JobInfo.waiting` unset and spares the read of
        every live job it takes, for callers that want the spec or the watermark
        only (a wait's polls, a search)."""
        rows = self._catalog_rows(*_of_job(key))
        best = current_row(rows)
        if best is None:
            return None
        (best,) = self._with_progress([best], key.database, key.table)
        info = JobInfo.from_row(best)
        if not waiting:
            return info
        return replace(self._waiting([info])[0], freshness=self._freshness(best))

    def _freshness(self, row: CatalogRow) -> dict[str, Any] | None:
        """The end-to-end freshness of the job's last write that recorded one."""
        if row.drop_at is not None:
            return None
        where = (eq("database", row.database), eq("table", row.table), eq("job_id", row.job_id))
        columns = ("database", "table", "ended_at", "members")  # what it filters on too
        runs = self._read(HISTORY_TABLE, Query(columns, where, explode="members"))
        traced = [r for r in runs if r.get("origin_at") is not None]
        if not traced:
            return None
        last = max(traced, key=lambda r: r["ended_at"])
        seconds = (last["ended_at"] - last["origin_at"]).total_seconds()
        return {
            "origin": last["origin_table"],
            "seconds": max(0.0, seconds),
            "at": last["ended_at"],
        }

    def list_jobs(
        self,
        state: JobState | str | None = None,
        account_id: int | None = None,
        include_dropped: bool = False,
    ) -> list[JobInfo]:
        """Jobs, optionally of one state or one account, ordered by key."""
        where = []
        if state is not None:
            where.append(eq("job_state", JobState(state).value))
        if account_id is not None:
            where.append(eq("account_id", account_id))
        if not include_dropped:
            where.append(Condition("drop_at", "is null"))
        rows = self._catalog_rows(*where)
        every = state is None and account_id is None  # every live job is among them
        live = [r for r in rows if r.is_live] if every else None
        return self._waiting(by_key(self._with_progress(rows)), live)

    def _waiting(self, jobs: list[JobInfo], live: list[CatalogRow] | None = None) -> list[JobInfo]:
        """The jobs, each live one downstream of a paused or failed job marked
        :attr:`JobInfo.waiting` (the nearest such job above it names why); ``live``:
        every live catalog row, when the caller has read them already."""
        if not any(j.drop_at is None for j in jobs):
            return jobs
        if live is None:
            live = self._catalog_rows(Condition("drop_at", "is null"))
        rows = {r.key: r for r in live}
        graph = Graph.of(r.node for r in live)
        out = []
        for job in jobs:
            stuck = next(
                (
                    rows[k]
                    for k in graph.above(job.key)
                    if rows[k].job_state in (JobState.PAUSED, JobState.ERROR)
                ),
                None,
            )
            if job.drop_at is None and stuck is not None:
                why = f"upstream job {stuck.key} is {stuck.job_state.value}"
                message = json.loads(stuck.job_status).get("error_msg")
                if stuck.job_state is JobState.ERROR and message:
                    why += f": {message}"
                job = replace(job, waiting=why)
            out.append(job)
        return out

    def usage(self, account_id: int | None = None, since: datetime | None = None) -> list[UsageRow]:
        """What jobs used, per job and hour (the ``usage`` table): of one account, from
        the hour of ``since`` on, oldest first. The service recomputes it from the
        iteration history every ``engine.usage_refresh_interval`` and at shutdown."""
        self._require_state()
        where = []
        if account_id is not None:
            where.append(eq("account_id", account_id))
        if since is not None:
            where.append(Condition("hour", ">=", hour_of(since)))
        # columns a table of an earlier release gained empty take their defaults
        rows = [
            UsageRow(**{k: v for k, v in r.items() if v is not None})
            for r in self._read(USAGE_TABLE, Query(None, tuple(where)))
        ]
        return sorted(rows, key=lambda u: (u.hour, u.account_id, u.job_id))

    def accounts(self) -> list[AccountRow]:
        """Each account's queued and running iterations, rows in flight, and since when
        it has been paused by backpressure or waiting, as the service last published
        them (every ``engine.status_flush_interval`` when they changed, and at
        shutdown; ``updated_at`` says when)."""
        self._require_state()
        rows = self._read(ACCOUNTS_TABLE, Query(order=("account_id",)))
        return [AccountRow(**r) for r in rows]

    def bulk_status(self, bulk_id: str) -> BulkStatus | None:
        """A bulk operation with its tasks (in task order), or None if the service has
        not recorded it (yet)."""
        self._require_state()
        found = self._read(BULK_OPERATIONS_TABLE, Query(where=(eq("bulk_id", bulk_id),)))
        if not found:
            return None
        tasks = self._read(
            BULK_TASKS_TABLE, Query(where=(eq("bulk_id", bulk_id),), order=("task_no",))
        )
        return BulkStatus(BulkOperation.from_row(found[0]), [BulkTask.from_row(t) for t in tasks])

    def wait_for_bulk(
        self,
        bulk_id: str,
        timeout: float = 600.0,
        poll: float = 0.5,
        progress: Callable[[BulkStatus], None] | None = None,
        rollback: bool = False,
    ) -> BulkStatus:
        """Block until the bulk operation has ended, or with ``rollback`` its rollback
        (the operation has ended before one starts); ``progress`` hears its status
        at every change. The tables are read again only after a new commit to them."""
        seen: list[BulkStatus] = []

        def tell(status: BulkStatus | None) -> None:
            if status is not None and progress is not None and (not seen or seen[-1] != status):
                seen.append(status)
                progress(status)

        def where(status: BulkStatus | None) -> str:
            stands = "is not recorded" if status is None else f"stands at {status.summary()}"
            return f"bulk operation {bulk_id} did not end within {timeout:.0f}s: it {stands}"

        status = poll_until(
            self._watches(BULK_TASKS_TABLE, BULK_OPERATIONS_TABLE),
            lambda: self.bulk_status(bulk_id),
            lambda s: s is not None and s.ended and (not rollback or s.operation.state.rollback),
            where,
            initial=None,
            timeout=timeout,
            poll=poll,
            progress=tell,
        )
        assert status is not None
        return status

    def request_outcome(
        self, request_id: str, receipt: Receipt | None = None
    ) -> dict[str, Any] | None:
        """What the service made of a request, once it has processed it: of the message
        of ``receipt`` when given (a request id sent twice has two verdicts), else
        of the first message with the id."""
        where = [eq("request_id", request_id)]
        if receipt is not None:
            where += [
                eq("topic", receipt.topic),
                eq("partition", receipt.partition),
                eq("offset", receipt.offset),
            ]
        rows = self._read(REQUESTS_TABLE, Query(where=tuple(where), order=("offset",)))
        return rows[0] if rows else None

    def wait_for_outcome(
        self,
        receipt: Receipt,
        timeout: float = 60.0,
        poll: float = 0.5,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Block until the service has applied (or rejected) the request.

        The requests table is read again only after a new commit to it. A job
        request's verdict is written before the catalog commit of its micro-batch
        (a replay keeps it), so an ``applied`` one that changed its job is returned
        once the catalog shows the message too: what the client reads next
        includes it.
        ``progress`` hears how long it has waited, every few seconds.
        """
        tell = Progress(progress)
        deadline = time.monotonic() + timeout
        outcome = poll_until(
            self._watches(REQUESTS_TABLE),
            lambda: self.request_outcome(receipt.request_id, receipt),
            lambda found: found is not None,
            lambda _: (
                f"request {receipt.request_id} not processed within {timeout:.0f}s; "
                "is the service running?"
            ),
            initial=None,
            timeout=timeout,
            poll=poll,
            progress=lambda _: tell(f"waiting for the service's verdict on {receipt.request_id}"),
        )
        assert outcome is not None
        if _for_the_catalog(outcome):
            left = max(deadline - time.monotonic(), 0.0)
            self._wait_for_catalog(receipt, outcome, left, poll, timeout, tell)
        return outcome

    def _wait_for_catalog(
        self,
        receipt: Receipt,
        outcome: dict[str, Any],
        left: float,
        poll: float,
        timeout: float,
        tell: Progress,
    ) -> None:
        """Until the catalog row of the request's job shows its message or a later one
        (on its partition: a row written from another cannot be ordered against it),
        or the state in which a verdict that changed no row found the job (an
        earlier message of its micro-batch may have set it), or, the row gone
        (garbage-collected), the job's unregister is recorded."""
        job_id = outcome["job_id"]
        key = JobKey(
            outcome["account_id"], outcome["database"], outcome["table"], outcome["job_name"]
        )
        where = (*_of_job(key), eq("job_id", job_id))
        claimed = _CLAIMS.get(outcome.get("detail") or "")

        def shown() -> bool:
            rows = self._catalog_rows(*where)
            if not rows:
                return self._unregistered_since(receipt, job_id)
            return any(
                r.shows(receipt.partition, receipt.offset)
                or (claimed is not None and claimed(r.job_state))
                for r in rows
            )

        poll_until(
            self._watches(CATALOG_TABLE, REQUESTS_TABLE),
            shown,
            lambda done: done,
            lambda _: (
                f"request {receipt.request_id} was applied, but the catalog did not show job "
                f"{key} written by it within {timeout:.0f}s; is the service running (or was "
                "the job dropped with another, and garbage-collected)?"
            ),
            initial=False,
            timeout=left,
            poll=poll,
            progress=lambda _: tell(f"waiting for the catalog to show {receipt.request_id}"),
        )

    def _unregistered_since(self, receipt: Receipt, job_id: int) -> bool:
        """Whether an applied unregister of job ``job_id`` is recorded at or after the
        message of ``receipt`` (its row may then be garbage-collected)."""
        where = (
            eq("topic", receipt.topic),
            eq("partition", receipt.partition),
            eq("job_id", job_id),
            eq("op", Operation.UNREGISTER.value),
            eq("outcome", "applied"),
        )
        rows = self._read(REQUESTS_TABLE, Query(where=where))
        return any(r["offset"] >= receipt.offset for r in rows)

    def source_version(self, database: str, table: str) -> int:
        """The current Delta version of a source table, resolved as the service does."""
        if self.tables is None:
            raise InvalidConfigError(
                "the client needs the service's tables settings to resolve a source: "
                "LakepropClient(kafka, state, spark, tables=config.tables)"
            )
        if isinstance(self.scan, SparkScan):
            from lakeprop.tables.resolve import Tables

            resolved = Tables(self.spark, self.tables)
            resolved.describe(database, table)  # a clear error for a missing source
            location = resolved.location(database, table)
        elif self.tables.resolution == "path":
            location = f"{self.tables.warehouse.rstrip('/')}/{database}/{table}"
            if self.scan.version(location) is None:
                raise SourceTableError(
                    f"source {database}.{table} ({location}) is not a Delta table"
                )
        else:
            raise InvalidConfigError("reading a source without Spark needs path tables")
        version = self.scan.version(location)
        if version is None:
            raise PermanentError(
                f"source {database}.{table} has no readable Delta log", ErrorCode.SOURCE_NOT_DELTA
            )
        return version

    def wait_for_watermark(
        self,
        key: JobKey,
        version: int | str = LATEST,
        timeout: float = 300.0,
        poll: float = 0.5,
        progress: Callable[[str], None] | None = None,
    ) -> JobInfo:
        """Block until the live job ``key`` has consumed source version ``version``.

        ``version`` is a Delta version of the source, or ``"latest"``: the
        source's version when the call starts. Returns the job once its
        watermark is at or past it, so its target reflects at least that
        version. Raises :class:`PermanentError` when the job is in ``error``,
        and :class:`TemporaryError` when the timeout passes first, saying
        where the job stands. A job that is not live yet (the service has not
        applied its register, or it was dropped and is being registered again)
        is waited for. The job is read again only after a new commit to the
        catalog or the iteration history. ``progress`` hears where the job
        stands, every few seconds.
        """
        if version == LATEST:
            target = self.source_version(key.database, key.table)
        elif isinstance(version, int) and not isinstance(version, bool) and version >= 0:
            target = version
        else:
            raise InvalidSpecError(
                f"version must be a Delta version (>= 0) or {LATEST!r}, got {version!r}"
            )
        tell = Progress(progress)

        def reached(job: JobInfo | None) -> bool:
            if job is None or job.drop_at is not None:
                return False
            if job.watermark is not None and job.watermark >= target:
                return True
            if job.state == JobState.ERROR.value:
                raise PermanentError(
                    f"job {key} is in error at watermark {job.watermark} "
                    f"[{job.status.get('error_code')}]: {job.status.get('error_msg')}"
                )
            return False

        found = poll_until(
            self._watches(CATALOG_TABLE, HISTORY_TABLE),
            lambda: self._job(key),
            reached,
            lambda job: (
                f"job {key} did not reach version {target} within {timeout:.0f}s: it {_where(job)}"
            ),
            initial=None,
            timeout=timeout,
            poll=poll,
            progress=lambda job: tell(
                f"waiting for job {key} to reach version {target}: it {_where(job)}"
            ),
        )
        assert found is not None
        return found

    def _watches(self, *tables: str) -> list[TableWatch]:
        return [TableWatch(self.scan, self._path(name)) for name in tables]

    def _job(self, key: JobKey) -> JobInfo | None:
        """``get_job_status``, or None while the service has not created its state."""
        if self.scan.version(self._path(CATALOG_TABLE)) is None:
            return None
        return self.get_job_status(key, waiting=False)


_CLAIMS: dict[str, Callable[[JobState], bool]] = {
    ALREADY_PAUSED: lambda state: state is JobState.PAUSED,
    NOT_PAUSED: lambda state: state is not JobState.PAUSED,
}
"""The state in which each applied verdict that changes no row found its job."""


def _of_job(key: JobKey) -> tuple[Condition, ...]:
    """The catalog rows of the jobs with this key."""
    return (
        eq("account_id", key.account_id),
        eq("database", key.database),
        eq("table", key.table),
        eq("job_name", key.job_name),
    )


def _for_the_catalog(outcome: Mapping[str, Any]) -> bool:
    """Whether a verdict is one to wait for the catalog on: an applied job message,
    which its micro-batch's catalog commit (after the verdict) shows in the job's
    row, or, for a pause of a paused job and a resume of a running one, by the
    state they found."""
    return (
        outcome["outcome"] == "applied"
        and outcome.get("job_name") is not None
        and outcome.get("job_id") is not None
    )


def _where(job: JobInfo | None) -> str:
    """Where a job stands, for a wait that timed out."""
    if job is None:
        return "is not in the catalog (is it registered, is the service running?)"
    if job.drop_at is not None:
        return f"was dropped at {job.drop_at}"
    return f"is at watermark {job.watermark} ({job.state})"
