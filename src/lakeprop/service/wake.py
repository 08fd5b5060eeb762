"""Micro-batches on demand: the query runs when the service has work, not on a clock.

The query reads the change log and a wake topic of its own
(:mod:`lakeprop.service.stream`). Spark asks the broker for both topics' end
offsets every poll, which costs an offset request and no micro-batch, and runs a
micro-batch when either has a new record. The :class:`Waker` writes a record to
the wake topic when the service has work:

* at once, when it is nudged: a commit notice for a table with a job, an
  iteration that finished (its result is to be recorded, and its table may be
  due again);
* at the time the last micro-batch named (:func:`next_batch_at`): the next tick
  while some table is probed on every tick (commit notifications off), or the
  earliest retry, periodic job, sweep or housekeeping.

So a service with nothing due runs no micro-batch, reads no state table and
probes no table. One wake record at a time is outstanding: the next is written
once a micro-batch has started. The waker also counts **ticks** for tests and
benchmarks: micro-batches, plus tick intervals that passed with nothing due
(:attr:`Waker.quiet_ticks`).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from lakeprop.config import AppConfig, KafkaConfig
from lakeprop.errors import BrokerError
from lakeprop.kafka import create_topic, settings

log = logging.getLogger(__name__)

RETENTION_MS = 24 * 3600 * 1000
"""How long the broker keeps wake records: they carry nothing, and one read late
or never (the service was down) is no loss."""
SEGMENT_MS = 3600 * 1000
"""Segments roll hourly, so expired wake records are deleted."""


def wake_topic(config: AppConfig) -> str:
    """The query's wake topic: ``kafka.wake_topic``, or ``<topic>.wake.<query name>``
    (``.<instance id>`` appended under ``cluster.enabled``: each instance has a
    query of its own)."""
    if config.kafka.wake_topic:
        return config.kafka.wake_topic
    name = f"{config.kafka.topic}.wake.{config.query_name}"
    if config.cluster.enabled:
        name = f"{name}.{config.cluster.instance()}"
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:249]


def next_batch_at(
    started: float, tick: float, poll: float, every_tick: bool, due: Iterable[float]
) -> float:
    """When the micro-batch that began at ``started`` wants the next one, with
    nothing told meanwhile (infinity: never).

    Work with a time (a retry, a periodic job, a sweep, housekeeping) runs at
    most once per ``tick``: at its time, but not before ``started + tick``. Work
    of every tick (a table probed on each one) wants the next tick on time: the
    wake is written one ``poll`` early, since Spark sees it only at its next
    trigger.
    """
    at = max(min(due, default=math.inf), started + tick)
    if every_tick:
        at = min(at, started + tick - poll)
    return at


class Waker:
    """Writes a wake record when the service has work; see the module docstring."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topic: str,
        tick: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.tick = tick
        self.clock = clock
        self.wakes = 0
        """Wake records written since the process started."""
        self.quiet_ticks = 0
        """Tick intervals that passed with nothing due and no micro-batch running."""
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._stop = threading.Event()
        self._nudged = False
        self._outstanding = False
        self._in_batch = False
        self._wanted_at = 0.0
        self._thread: threading.Thread | None = None
        self._producer: Any = None

    def ensure_topic(self, timeout: float = 30.0) -> None:
        create_topic(
            self.kafka,
            self.topic,
            1,
            {"retention.ms": str(RETENTION_MS), "segment.ms": str(SEGMENT_MS)},
            timeout,
        )

    def start(self) -> Waker:
        """Create the topic if needed and start waking the query: the first micro-batch
        is wanted at once (a start probes every table)."""
        self.ensure_topic()
        self._producer = self._new_producer()
        with self._lock:
            self._nudged = self._outstanding = self._in_batch = False
            self._wanted_at = 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lakeprop-waker", daemon=True)
        self._thread.start()
        return self

    def wake_once(self, timeout: float = 30.0) -> None:
        """Write one wake record now and wait for the broker to take it (a query run
        with ``availableNow`` then runs at least one micro-batch)."""
        self.ensure_topic(timeout)
        producer = self._new_producer()
        if not self._write(producer, "once", timeout):
            raise BrokerError(f"could not write to the wake topic {self.topic}")

    def stop(self) -> None:
        self._stop.set()
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None

    # -- what the service tells it ---------------------------------------------------------

    def nudge(self) -> None:
        """There is work now (a notice, a finished iteration): wake the query."""
        with self._lock:
            self._nudged = True
        self._event.set()

    def batch_started(self) -> None:
        """A micro-batch began: it saw every wake record written so far."""
        with self._lock:
            self._in_batch = True
            self._outstanding = False

    def batch_ended(self, wanted_at: float) -> None:
        """A micro-batch ended and wants the next one at ``wanted_at`` (:func:`next_batch_at`)."""
        with self._lock:
            self._in_batch = False
            self._wanted_at = wanted_at
        self._event.set()

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            write, wait, idle = self.decide(self.clock())
            if write and not self._write(self._producer, "due", min(self.tick, 30.0)):
                with self._lock:
                    self._outstanding = False
                    self._nudged = True  # written again after a pause
                self._stop.wait(min(self.tick, 5.0))
                continue
            if self._event.wait(wait):
                self._event.clear()
                continue
            if idle:
                self.passed(self.clock())

    def decide(self, now: float) -> tuple[bool, float, bool]:
        """One look: whether to write a wake record now, how long to wait before the
        next look, and whether nothing is due or under way (a quiet wait)."""
        with self._lock:
            due = self._nudged or (not self._in_batch and now >= self._wanted_at)
            write = due and not self._outstanding
            if write:
                self._nudged = False
                self._outstanding = True
            if due or self._in_batch or self._outstanding:
                return write, self.tick, False
            return False, max(0.0, min(self.tick, self._wanted_at - now)), True

    def passed(self, now: float) -> None:
        """A quiet wait passed untold: a quiet tick, unless the wanted time came."""
        with self._lock:
            busy = self._in_batch or self._outstanding or self._nudged
            if not busy and now < self._wanted_at:
                self.quiet_ticks += 1

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        return Producer(settings(self.kafka, defaults={"linger.ms": 0, "log_level": 3}))

    def _write(self, producer: Any, reason: str, timeout: float) -> bool:
        """Write one wake record; whether the broker took it."""
        delivered: list[bool] = []
        try:
            producer.produce(
                self.topic,
                value=reason.encode(),
                partition=0,
                on_delivery=lambda err, _msg: delivered.append(err is None),
            )
            producer.flush(timeout)
        except Exception as exc:  # a broker outage: the caller tries again
            log.warning("could not write to the wake topic %s: %s", self.topic, exc)
            return False
        if delivered != [True]:
            log.warning("the wake topic %s did not take a wake record", self.topic)
            return False
        self.wakes += 1
        return True
