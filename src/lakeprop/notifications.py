"""Commit notifications: "table T reached version v", on a topic of their own.

A writing application announces its commits (``LakepropClient.notify_commit``),
and the service probes only the announced tables, plus each table once per
sweep interval (:mod:`lakeprop.engine.dirty`). A notice is a hint, never a
command: a lost or duplicated one costs at most a sweep interval of latency or
one extra probe, so the topic is read from its end when the service starts
(the first tick probes every table anyway) and no offsets are kept. Message::

    key:   "<database>.<table>"
    value: {"version": 1, "database": "sales", "table": "orders", "table_version": 42}

A notice that does not decode is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakeprop.changelog import create_topic
from lakeprop.config import KafkaConfig
from lakeprop.errors import BrokerError, InvalidMessageError
from lakeprop.identifiers import validate_identifier

log = logging.getLogger(__name__)

NOTICE_VERSION = 1
RETENTION_MS = 24 * 3600 * 1000
"""Notices are worth nothing after a sweep interval: a day of them is plenty."""


@dataclass(frozen=True)
class CommitNotice:
    """A writer's word that ``database.table`` reached ``version``."""

    database: str
    table: str
    version: int

    def encode(self) -> tuple[bytes, bytes]:
        value = {
            "version": NOTICE_VERSION,
            "database": self.database,
            "table": self.table,
            "table_version": self.version,
        }
        return f"{self.database}.{self.table}".encode(), json.dumps(value).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> CommitNotice:
        try:
            obj = json.loads(value or b"")
        except ValueError as exc:
            raise InvalidMessageError(f"commit notice is not JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.get("version") != NOTICE_VERSION:
            raise InvalidMessageError(
                f"commit notice must be a JSON object with version {NOTICE_VERSION}"
            )
        version = obj.get("table_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InvalidMessageError(
                f"commit notice table_version must be a Delta version (>= 0), got {version!r}"
            )
        for name in ("database", "table"):
            if not isinstance(obj.get(name), str):
                raise InvalidMessageError(f"commit notice {name} must be a string")
            validate_identifier(obj[name], name)
        return cls(obj["database"], obj["table"], version)


def ensure_notice_topic(kafka: KafkaConfig, topic: str, timeout: float = 30.0) -> None:
    create_topic(kafka, topic, kafka.topic_partitions, {"retention.ms": str(RETENTION_MS)}, timeout)


class NoticeListener:
    """Reads the notifications topic from its end on a thread of its own and hands
    each notice to ``on_notice``. Every partition's position is fixed when
    :meth:`start` returns, so no notice sent after that is missed."""

    def __init__(
        self, kafka: KafkaConfig, topic: str, on_notice: Callable[[CommitNotice], None]
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.on_notice = on_notice
        self.skipped = 0
        """Notices that did not decode."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None

    def start(self, timeout: float = 30.0) -> NoticeListener:
        """Create the topic if needed and start reading it from its end; raises
        :class:`~lakeprop.errors.BrokerError` when the broker cannot be reached."""
        from confluent_kafka import KafkaException

        ensure_notice_topic(self.kafka, self.topic, timeout)
        try:
            self._consumer = self._assigned_at_end(timeout)
        except KafkaException as exc:
            raise BrokerError(
                f"could not read the notifications topic {self.topic}: {exc.args[0].str()}"
            ) from None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lakeprop-notices", daemon=True)
        self._thread.start()
        log.info("listening for commit notices on %s", self.topic)
        return self

    def _assigned_at_end(self, timeout: float) -> Any:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.kafka.bootstrap_servers,
                "group.id": f"lakeprop-notices-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "log_level": 3,
                **self.kafka.options,
            }
        )
        partitions = consumer.list_topics(self.topic, timeout=timeout).topics[self.topic].partitions
        ends = []
        for partition in sorted(partitions):
            _, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=timeout
            )
            ends.append(TopicPartition(self.topic, partition, high))
        consumer.assign(ends)
        return consumer

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                log.debug("notifications topic %s: %s", self.topic, message.error())
                continue
            try:
                notice = CommitNotice.decode(message.value())
            except InvalidMessageError as exc:
                self.skipped += 1
                log.warning(
                    "skipped a commit notice at %s:%d:%d: %s",
                    self.topic,
                    message.partition(),
                    message.offset(),
                    exc,
                )
                continue
            self.on_notice(notice)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
