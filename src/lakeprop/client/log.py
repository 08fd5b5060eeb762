"""Writing the change log: the client's producer of job operations and commit notices.

Every message goes through a confluent-kafka producer with idempotence and
``acks=all``; each call returns only once the broker has confirmed it
(a :class:`Receipt`), and raises :class:`~lakeprop.errors.DeliveryError`
otherwise. No Spark is needed: a CLI verb that only writes starts none. The
service applies the message in its next micro-batch.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lakeprop.bulk.model import BulkOp, Selector, parse_bulk_op
from lakeprop.changelog import JOB_PARTITION, Operation, encode, encode_bulk
from lakeprop.config import KafkaConfig, NotificationsConfig
from lakeprop.errors import DeliveryError, InvalidSpecError
from lakeprop.identifiers import validate_identifier
from lakeprop.kafka import settings
from lakeprop.notifications import CommitNotice, ensure_notice_topic
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.status import JobState


@dataclass(frozen=True)
class Receipt:
    """Proof that the broker stored a change log message."""

    request_id: str
    topic: str
    partition: int
    offset: int
    timestamp: datetime
    """The message's Kafka timestamp: the job's create_at / drop_at once applied."""


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


KAFKA_LOG = logging.getLogger("lakeprop.kafka")
"""Where the producer's own (librdkafka) log lines go, each repeat once a minute."""
KAFKA_LOG.addFilter(Repeats())


def producer_config(kafka: KafkaConfig) -> dict[str, Any]:
    return settings(
        kafka,
        defaults={
            "enable.idempotence": True,
            "acks": "all",
            "delivery.timeout.ms": int(kafka.delivery_timeout * 1000),
            "logger": KAFKA_LOG,
        },
    )


class ChangeLogWriter:
    """The change log's writer: job operations, bulk operations and commit notices.

    ``source_version`` resolves a source table's current Delta version, for a
    notice without one (the state reader's, in :class:`~lakeprop.client.api.LakepropClient`).
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        notifications: NotificationsConfig | None = None,
        source_version: Callable[[str, str], int] | None = None,
    ) -> None:
        self.kafka = kafka
        self.notifications = notifications or NotificationsConfig()
        self._version_of = source_version
        self._notice_topic_ready = False
        self._producer: Any = None

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

    def unregister_job(self, key: JobKey, *, cascade: bool = False) -> Receipt:
        """Drop a job. A job whose target other jobs read is dropped only with
        ``cascade``, which drops them too (at any depth); without it the
        unregister is rejected, naming them."""
        return self._send(Operation.UNREGISTER, key, cascade=cascade)

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
        commits has them propagated at once (within the service's ``poll_interval``).
        Returns the version sent.
        """
        validate_identifier(database, "database")
        validate_identifier(table, "table")
        if version is None:
            if self._version_of is None:
                raise InvalidSpecError("notify_commit needs a version, or a reader of the source")
            version = self._version_of(database, table)
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
                partition=JOB_PARTITION,  # one order for every instance's graph decisions
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
