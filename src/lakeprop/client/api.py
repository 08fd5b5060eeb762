"""The Python client: register, unregister and re-spec jobs; read their status.

Writes go to the change log topic through a confluent-kafka producer with
idempotence and ``acks=all``; each call returns only once the broker has
confirmed the message, and raises :class:`~lakeprop.errors.DeliveryError`
otherwise. The service applies the message in its next micro-batch; reads
(``get_job_status``, ``list_jobs``, ``wait_for_outcome``,
``wait_for_watermark``) look at the catalog, history and requests Delta tables,
so they need a SparkSession. A job's watermark is the later of the catalog's
and the one its iteration history records: the service writes the catalog's
watermarks on its status flush, the history at the end of every iteration.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakeprop.bulk.model import (
    BulkOp,
    BulkOperation,
    BulkTask,
    Selector,
    TaskState,
    counts,
    parse_bulk_op,
)
from lakeprop.bulk.tables import BulkTables
from lakeprop.changelog import Operation, encode, encode_bulk
from lakeprop.config import KafkaConfig, NotificationsConfig, StateConfig, TablesConfig
from lakeprop.errors import (
    DeliveryError,
    ErrorCode,
    InvalidConfigError,
    InvalidSpecError,
    PermanentError,
    StateNotFoundError,
    TemporaryError,
)
from lakeprop.identifiers import validate_identifier
from lakeprop.notifications import CommitNotice, ensure_notice_topic
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state import store as state
from lakeprop.state.accounts import AccountRow, AccountsTable
from lakeprop.state.catalog import CatalogRow
from lakeprop.state.history import IterationHistory, rolled_forward
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
from lakeprop.tables.probe import DeltaLogProbe

LATEST = "latest"
"""``wait_for_watermark``'s version meaning the source table's current version."""


class TableWatch:
    """Tells whether a Delta table has a new commit since the last look, from a
    listing of its log (no Spark job): waits re-read a state table only then."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.probe = DeltaLogProbe(spark)
        self.path = path
        self.seen: int | None = None
        self.looked = False

    def changed(self) -> bool:
        version = self.probe.latest_version(self.path)
        if self.looked and version == self.seen:
            return False
        self.seen, self.looked = version, True
        return True


@dataclass(frozen=True)
class Receipt:
    """Proof that the broker stored a change log message."""

    request_id: str
    topic: str
    partition: int
    offset: int
    timestamp: datetime
    """The message's Kafka timestamp: the job's create_at / drop_at once applied."""


@dataclass(frozen=True)
class JobInfo:
    """A job as the catalog holds it, with spec and status decoded."""

    key: JobKey
    job_id: int
    table_id: str
    state: str
    watermark: int | None
    spec: dict[str, Any]
    status: dict[str, Any]
    create_at: datetime
    drop_at: datetime | None

    @classmethod
    def from_row(cls, row: CatalogRow) -> JobInfo:
        return cls(
            key=row.key,
            job_id=row.job_id,
            table_id=row.table_id,
            state=row.job_state.value,
            watermark=row.watermark,
            spec=json.loads(row.job_spec),
            status=json.loads(row.job_status),
            create_at=row.create_at,
            drop_at=row.drop_at,
        )


class Repeats(logging.Filter):
    """Lets a message through once per ``window`` seconds: a broker that is down makes
    the Kafka client log the same failed connection many times a second. Numbers
    (ports aside, timings) do not make a message new."""

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window = window
        self.clock = clock
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        shape = re.sub(r"\d+", "#", record.getMessage())
        now = self.clock()
        if now - self._last.get(shape, float("-inf")) < self.window:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[shape] = now
        return True


class Progress:
    """Reports a long wait to a person: ``report`` hears the message, with the seconds
    waited, at most once per ``every`` seconds (the first time after ``every``)."""

    def __init__(
        self,
        report: Callable[[str], None] | None,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report = report
        self.every = every
        self.clock = clock
        self.started = clock()
        self._next = self.started + every

    def __call__(self, message: str) -> None:
        now = self.clock()
        if self.report is not None and now >= self._next:
            self.report(f"{message} ({now - self.started:.0f}s)")
            self._next = now + self.every


KAFKA_LOG = logging.getLogger("lakeprop.kafka")
"""Where the producer's own (librdkafka) log lines go, each repeat once a minute."""
KAFKA_LOG.addFilter(Repeats())


def producer_config(kafka: KafkaConfig) -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "delivery.timeout.ms": int(kafka.delivery_timeout * 1000),
        "logger": KAFKA_LOG,
        **kafka.options,
    }


Message = tuple[Operation, JobKey, dict[str, Any]]
"""An operation on a job with the fields of its envelope (spec, interrupt)."""


@dataclass(frozen=True)
class BulkStatus:
    """A bulk operation and its tasks, as the service last wrote them."""

    operation: BulkOperation
    tasks: list[BulkTask]

    @property
    def done(self) -> int:
        """Tasks that will not run again (unless rolled back)."""
        return sum(t.state.terminal for t in self.tasks)

    @property
    def failed(self) -> int:
        return sum(t.state in (TaskState.FAIL, TaskState.ROLLBACK_FAIL) for t in self.tasks)

    @property
    def ended(self) -> bool:
        return self.operation.state.terminal

    def summary(self) -> str:
        by_state = ", ".join(f"{n} {s}" for s, n in sorted(counts(self.tasks).items()))
        return (
            f"bulk {self.operation.bulk_id} ({self.operation.operation.value}): "
            f"{self.operation.state.value}, {self.done}/{len(self.tasks)} tasks done, "
            f"{self.failed} failed [{by_state}]"
        )


class LakepropClient:
    """Client of the change log (writes) and of the state tables (reads)."""

    def __init__(
        self,
        kafka: KafkaConfig,
        state_config: StateConfig | None = None,
        spark: SparkSession | None = None,
        tables: TablesConfig | None = None,
        notifications: NotificationsConfig | None = None,
    ) -> None:
        self.kafka = kafka
        self.state = state_config or StateConfig()
        self.tables = tables
        """How sources resolve (the service's ``tables`` settings): needed for ``latest``."""
        self.notifications = notifications or NotificationsConfig()
        self._notice_topic_ready = False
        self._spark = spark
        self._producer: Any = None

    # -- writes -------------------------------------------------------------------------

    def register_job(self, key: JobKey, spec: JobSpec | Mapping[str, Any]) -> Receipt:
        """Ask the service to create a job; fails fast on a spec that cannot validate."""
        (receipt,) = self.register_jobs([(key, spec)])
        return receipt

    def register_jobs(
        self, jobs: Sequence[tuple[JobKey, JobSpec | Mapping[str, Any]]]
    ) -> list[Receipt]:
        """Register many jobs with one round of deliveries; every spec is checked first,
        so a bad one sends nothing."""
        messages = []
        for key, spec in jobs:
            body = spec.to_json() if isinstance(spec, JobSpec) else dict(spec)
            JobSpec.from_json(body)
            messages.append((Operation.REGISTER, key, {"spec": body}))
        return self._send_all(messages)

    def unregister_job(self, key: JobKey) -> Receipt:
        return self._send(Operation.UNREGISTER, key)

    def update_job_spec(
        self, key: JobKey, spec: Mapping[str, Any], *, interrupt: bool = False
    ) -> Receipt:
        """Send a partial spec; empty fields keep their current values."""
        if not isinstance(spec, Mapping):
            raise InvalidSpecError("update_job_spec needs a (partial) spec object")
        return self._send(Operation.UPDATE_SPEC, key, spec=dict(spec), interrupt=interrupt)

    def pause_job(self, key: JobKey) -> Receipt:
        """Pause a job: it keeps its watermark and runs no iteration until resumed (a
        running iteration is stopped)."""
        return self._send(Operation.PAUSE, key)

    def resume_job(self, key: JobKey) -> Receipt:
        """Resume a paused job: it catches up from its watermark."""
        return self._send(Operation.RESUME, key)

    def resync_job(self, key: JobKey) -> Receipt:
        """Rebuild a job's target: a snapshot at the source's current version, then tails."""
        return self._send(Operation.RESYNC, key)

    def notify_commit(self, database: str, table: str, version: int | None = None) -> int:
        """Announce that a source table reached ``version`` (default: its latest).

        With ``notifications.enabled`` the service probes only announced tables
        (and each table once per sweep interval), so a writer that announces its
        commits has them propagated on the next tick. Returns the version sent.
        """
        validate_identifier(database, "database")
        validate_identifier(table, "table")
        if version is None:
            version = self.source_version(database, table)
        elif isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidSpecError(f"version must be a Delta version (>= 0), got {version!r}")
        if not self._notice_topic_ready:
            ensure_notice_topic(self.kafka, self.notifications.topic)
            self._notice_topic_ready = True
        key, value = CommitNotice(database, table, version).encode()
        self._deliver(self.notifications.topic, key, value, f"commit notice of {database}.{table}")
        return version

    def _producer_ready(self) -> Any:
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer(producer_config(self.kafka))
        return self._producer

    def _deliver(self, topic: str, key: bytes, value: bytes, what: str) -> None:
        producer = self._producer_ready()
        delivered: list[Any] = []
        producer.produce(
            topic, key=key, value=value, on_delivery=lambda err, _: delivered.append(err)
        )
        producer.flush(self.kafka.delivery_timeout + 5)
        if not delivered:
            raise DeliveryError(
                f"{what} was not confirmed by {self.kafka.bootstrap_servers} "
                f"within {self.kafka.delivery_timeout:.0f}s"
            )
        if delivered[0] is not None:
            raise DeliveryError(
                f"{what} was not delivered to {topic} on {self.kafka.bootstrap_servers}: "
                f"{delivered[0].str()}"
            )

    def _send(self, op: Operation, key: JobKey, **fields: Any) -> Receipt:
        (receipt,) = self._send_all([(op, key, fields)])
        return receipt

    def _send_all(
        self, messages: Sequence[tuple[Operation, JobKey, dict[str, Any]]]
    ) -> list[Receipt]:
        """Produce every message, wait for the broker once, and return their receipts in
        order, or raise DeliveryError naming the first one that was not confirmed."""
        return self._produce_all(
            [(f"{op.value} of {key}", *encode(op, key, **fields)) for op, key, fields in messages]
        )

    def _produce_all(self, messages: Sequence[tuple[str, str, bytes, bytes]]) -> list[Receipt]:
        """Produce (what, request id, key, value) messages and wait for the broker once."""
        producer = self._producer_ready()
        delivered: dict[int, tuple[Any, Any]] = {}
        for i, (_, _, message_key, value) in enumerate(messages):
            producer.produce(
                self.kafka.topic,
                key=message_key,
                value=value,
                on_delivery=lambda err, msg, i=i: delivered.__setitem__(i, (err, msg)),
            )
            producer.poll(0)  # serve delivery callbacks, keep the queue short
        producer.flush(self.kafka.delivery_timeout + 5)
        receipts = []
        for i, (what, request_id, _, _) in enumerate(messages):
            if i not in delivered:
                raise DeliveryError(
                    f"{what} was not confirmed by {self.kafka.bootstrap_servers} "
                    f"within {self.kafka.delivery_timeout:.0f}s"
                )
            err, msg = delivered[i]
            if err is not None:
                raise DeliveryError(
                    f"{what} was not delivered to {self.kafka.topic} on "
                    f"{self.kafka.bootstrap_servers}: {err.str()}"
                )
            _, millis = msg.timestamp()
            receipts.append(
                Receipt(
                    request_id,
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    # exact to the millisecond, as Spark reads the same Kafka timestamp
                    datetime.fromtimestamp(millis // 1000).replace(
                        microsecond=millis % 1000 * 1000
                    ),
                )
            )
        return receipts

    # -- bulk operations ------------------------------------------------------------------

    def bulk(
        self,
        account_id: int,
        operation: BulkOp | str,
        *,
        database: str | None = None,
        table: str | None = None,
        job_name: str | None = None,
        consumer_type: str | None = None,
        job_state: JobState | str | None = None,
        jobs: Sequence[tuple[str, str, str]] | None = None,
        spec: Mapping[str, Any] | None = None,
        interrupt: bool | None = None,
        bulk_id: str | None = None,
    ) -> Receipt:
        """Ask for one operation on every live job of ``account_id`` that the selector
        matches (``database``, ``table`` and ``job_name`` are glob patterns;
        ``jobs`` lists (database, table, name)). ``operation`` is pause, resume,
        resync, update_spec (with a partial ``spec``) or unregister. The receipt's
        request id is the bulk operation's id; sending the same ``bulk_id``
        again is answered ``already_exists``."""
        op = operation if isinstance(operation, BulkOp) else parse_bulk_op(operation)
        selector_json: dict[str, Any] = {
            name: value
            for name, value in (
                ("database", database),
                ("table", table),
                ("job_name", job_name),
                ("consumer_type", consumer_type),
                ("state", None if job_state is None else JobState(job_state).value),
            )
            if value is not None
        }
        if jobs is not None:
            selector_json["jobs"] = [{"database": d, "table": t, "name": n} for d, t, n in jobs]
        selector = Selector.from_json(account_id, selector_json)
        if (op is BulkOp.UPDATE_SPEC) != (spec is not None):
            raise InvalidSpecError("a bulk update_spec needs a partial spec, and only it takes one")
        encoded = encode_bulk(
            Operation.BULK,
            account_id,
            bulk_id,
            selector=selector.to_json(),
            operation=op.value,
            spec=None if spec is None else dict(spec),
            interrupt=interrupt,
        )
        (receipt,) = self._produce_all([(f"bulk {op.value} of account {account_id}", *encoded)])
        return receipt

    def cancel_bulk(self, account_id: int, bulk_id: str) -> Receipt:
        """Cancel a running bulk operation: its tasks that have not started never will."""
        encoded = encode_bulk(Operation.BULK_CANCEL, account_id, bulk_id)
        (receipt,) = self._produce_all([(f"cancel of bulk {bulk_id}", *encoded)])
        return receipt

    def rollback_bulk(self, account_id: int, bulk_id: str) -> Receipt:
        """Undo the tasks of an ended bulk operation that succeeded, from their
        before-images."""
        encoded = encode_bulk(Operation.BULK_ROLLBACK, account_id, bulk_id)
        (receipt,) = self._produce_all([(f"rollback of bulk {bulk_id}", *encoded)])
        return receipt

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.kafka.delivery_timeout)
            self._producer = None

    # -- reads --------------------------------------------------------------------------

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = SparkSession.builder.getOrCreate()
        return self._spark

    def _catalog_rows(self, condition: Any = None) -> list[CatalogRow]:
        path = self.state.table_path(CATALOG_TABLE)
        if DeltaLogProbe(self.spark).latest_version(path) is None:
            raise StateNotFoundError(
                f"no job catalog at {path}: the service has not run with state.location "
                f"{self.state.location} yet (or the config points elsewhere)"
            )
        df = state.read_table(self.spark, path)
        if condition is not None:
            df = df.where(condition)
        return [CatalogRow.from_spark(r) for r in df.collect()]

    def _with_progress(
        self, rows: list[CatalogRow], database: str | None = None, table: str | None = None
    ) -> list[CatalogRow]:
        """The rows with the watermarks the iteration history records, where ahead."""
        path = self.state.table_path(HISTORY_TABLE)
        if (
            not any(r.is_live for r in rows)
            or DeltaLogProbe(self.spark).latest_version(path) is None
        ):
            return rows
        reached = IterationHistory(self.spark, path).latest_success(database, table)
        return [rolled_forward(r, reached) or r for r in rows]

    def get_job_status(self, key: JobKey) -> JobInfo | None:
        """The live job with this key, or else its most recently dropped one."""
        rows = self._catalog_rows(
            (F.col("account_id") == key.account_id)
            & (F.col("database") == key.database)
            & (F.col("table") == key.table)
            & (F.col("job_name") == key.job_name)
        )
        if not rows:
            return None
        best = max(rows, key=lambda r: (r.is_live, r.create_at, r.job_id))
        (best,) = self._with_progress([best], key.database, key.table)
        return JobInfo.from_row(best)

    def list_jobs(
        self,
        state: JobState | str | None = None,
        account_id: int | None = None,
        include_dropped: bool = False,
    ) -> list[JobInfo]:
        """Jobs, optionally of one state or one account, ordered by key."""
        condition = F.lit(True)
        if state is not None:
            condition &= F.col("job_state") == JobState(state).value
        if account_id is not None:
            condition &= F.col("account_id") == account_id
        if not include_dropped:
            condition &= F.col("drop_at").isNull()
        rows = self._with_progress(self._catalog_rows(condition))
        return [JobInfo.from_row(r) for r in sorted(rows, key=lambda r: (r.key, r.job_id))]

    def usage(self, account_id: int | None = None, since: datetime | None = None) -> list[UsageRow]:
        """What jobs used, per job and hour (the ``usage`` table): of one account, from
        the hour of ``since`` on, oldest first. The service recomputes it from the
        iteration history every ``engine.usage_refresh_interval`` and at shutdown."""
        self._catalog_rows(F.lit(False))  # no state at all: a clear error
        path = self.state.table_path(USAGE_TABLE)
        if DeltaLogProbe(self.spark).latest_version(path) is None:
            return []  # a service of an earlier release
        df = state.read_table(self.spark, path)
        if account_id is not None:
            df = df.where(F.col("account_id") == account_id)
        if since is not None:
            df = df.where(F.col("hour") >= F.lit(hour_of(since)))
        # columns a table of an earlier release gained empty take their defaults
        rows = [
            UsageRow(**{k: v for k, v in r.asDict().items() if v is not None}) for r in df.collect()
        ]
        return sorted(rows, key=lambda u: (u.hour, u.account_id, u.job_id))

    def accounts(self) -> list[AccountRow]:
        """Each account's queued and running iterations, rows in flight, and since when
        it has been paused by backpressure or waiting, as the service last published
        them (every ``engine.status_flush_interval`` when they changed, and at
        shutdown; ``updated_at`` says when)."""
        self._catalog_rows(F.lit(False))  # no state at all: a clear error
        return AccountsTable(self.spark, self.state.table_path(ACCOUNTS_TABLE)).read()

    def bulk_status(self, bulk_id: str) -> BulkStatus | None:
        """A bulk operation with its tasks (in task order), or None if the service has
        not recorded it (yet)."""
        self._catalog_rows(F.lit(False))  # no state at all: a clear error
        tables = BulkTables(
            self.spark,
            self.state.table_path(BULK_OPERATIONS_TABLE),
            self.state.table_path(BULK_TASKS_TABLE),
        )
        if DeltaLogProbe(self.spark).latest_version(tables.operations_path) is None:
            return None  # a service of an earlier release
        found = tables.operations(bulk_id)
        return BulkStatus(found[0], tables.tasks([bulk_id])) if found else None

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
        deadline = time.monotonic() + timeout
        watches = [
            TableWatch(self.spark, self.state.table_path(name))
            for name in (BULK_TASKS_TABLE, BULK_OPERATIONS_TABLE)
        ]
        status: BulkStatus | None = None
        while True:
            if any([w.changed() for w in watches]):
                status = self.bulk_status(bulk_id)
                if status is not None and progress is not None:
                    progress(status)
            if (
                status is not None
                and status.ended
                and (not rollback or status.operation.state.rollback)
            ):
                return status
            if time.monotonic() >= deadline:
                where = "is not recorded" if status is None else f"stands at {status.summary()}"
                raise TemporaryError(
                    f"bulk operation {bulk_id} did not end within {timeout:.0f}s: it {where}"
                )
            time.sleep(poll)

    def request_outcome(
        self, request_id: str, receipt: Receipt | None = None
    ) -> dict[str, Any] | None:
        """What the service made of a request, once it has processed it: of the message
        of ``receipt`` when given (a request id sent twice has two verdicts), else
        of the first message with the id."""
        path = self.state.table_path(REQUESTS_TABLE)
        if not DeltaTable.isDeltaTable(self.spark, path):
            return None  # the service has not started on this state yet
        condition = F.col("request_id") == request_id
        if receipt is not None:
            condition &= (
                (F.col("topic") == receipt.topic)
                & (F.col("partition") == receipt.partition)
                & (F.col("offset") == receipt.offset)
            )
        rows = state.read_table(self.spark, path).where(condition).orderBy("offset").collect()
        return rows[0].asDict() if rows else None

    def wait_for_outcome(
        self,
        receipt: Receipt,
        timeout: float = 60.0,
        poll: float = 0.5,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Block until the service has applied (or rejected) the request.

        The requests table is read again only after a new commit to it.
        ``progress`` hears how long it has waited, every few seconds.
        """
        deadline = time.monotonic() + timeout
        watch = TableWatch(self.spark, self.state.table_path(REQUESTS_TABLE))
        tell = Progress(progress)
        while True:
            tell(f"waiting for the service's verdict on {receipt.request_id}")
            outcome = self.request_outcome(receipt.request_id, receipt) if watch.changed() else None
            if outcome is not None:
                return outcome
            if time.monotonic() >= deadline:
                raise TemporaryError(
                    f"request {receipt.request_id} not processed within {timeout:.0f}s; "
                    "is the service running?"
                )
            time.sleep(poll)

    def source_version(self, database: str, table: str) -> int:
        """The current Delta version of a source table, resolved as the service does."""
        from lakeprop.tables.resolve import Tables

        if self.tables is None:
            raise InvalidConfigError(
                "the client needs the service's tables settings to resolve a source: "
                "LakepropClient(kafka, state, spark, tables=config.tables)"
            )
        resolved = Tables(self.spark, self.tables)
        resolved.describe(database, table)  # a clear error for a missing source
        version = DeltaLogProbe(self.spark).latest_version(resolved.location(database, table))
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
        deadline = time.monotonic() + timeout
        watches = [
            TableWatch(self.spark, self.state.table_path(name))
            for name in (CATALOG_TABLE, HISTORY_TABLE)
        ]
        job: JobInfo | None = None
        tell = Progress(progress)
        while True:
            if any([w.changed() for w in watches]):
                job = self._job(key)
            tell(f"waiting for job {key} to reach version {target}: it {_where(job)}")
            if job is not None and job.drop_at is None:
                if job.watermark is not None and job.watermark >= target:
                    return job
                if job.state == JobState.ERROR.value:
                    raise PermanentError(
                        f"job {key} is in error at watermark {job.watermark} "
                        f"[{job.status.get('error_code')}]: {job.status.get('error_msg')}"
                    )
            if time.monotonic() >= deadline:
                raise TemporaryError(
                    f"job {key} did not reach version {target} within {timeout:.0f}s: "
                    f"it {_where(job)}"
                )
            time.sleep(poll)

    def _job(self, key: JobKey) -> JobInfo | None:
        """``get_job_status``, or None while the service has not created its state."""
        if not DeltaTable.isDeltaTable(self.spark, self.state.table_path(CATALOG_TABLE)):
            return None
        return self.get_job_status(key)


def _where(job: JobInfo | None) -> str:
    """Where a job stands, for a wait that timed out."""
    if job is None:
        return "is not in the catalog (is it registered, is the service running?)"
    if job.drop_at is not None:
        return f"was dropped at {job.drop_at}"
    return f"is at watermark {job.watermark} ({job.state})"
