"""The service's reader of commit notifications (the format: :mod:`lakeprop.notifications`)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from lakeprop.config import KafkaConfig
from lakeprop.errors import BrokerError, InvalidMessageError
from lakeprop.kafka import settings
from lakeprop.notifications import CommitNotice, ensure_notice_topic

log = logging.getLogger(__name__)


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
            settings(
                self.kafka,
                defaults={
                    "group.id": f"lakeprop-notices-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "log_level": 3,
                },
            )
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


class NoticePublisher:
    """The service's own commit notices (with ``cluster.enabled``): a write to a table
    other live jobs read is announced on the notifications topic, so the instance
    serving those jobs starts the next step of the chain at once instead of at its
    next sweep. Produced without waiting (a notice is a hint: one lost costs at most
    a sweep interval); what is queued is flushed at :meth:`stop`."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.published = 0
        self._producer: Any = None

    def publish(self, notice: CommitNotice) -> None:
        """Queue ``notice``; never raises (it is called after a history write, and a
        notice not sent costs the reader a sweep interval at most)."""
        try:
            if self._producer is None:
                from confluent_kafka import Producer

                self._producer = Producer(settings(self.kafka, defaults={"linger.ms": 0}))
            key, value = notice.encode()
            self._producer.produce(self.topic, key=key, value=value)
            self._producer.poll(0)
            self.published += 1
        except Exception as exc:  # a bad setting, BufferError, KafkaException
            log.warning("commit notice of %s.%s not sent: %s", notice.database, notice.table, exc)

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued, then let the producer go (it reconnects for ever)."""
        if self._producer is not None:
            self._producer.flush(timeout)
            self._producer = None
