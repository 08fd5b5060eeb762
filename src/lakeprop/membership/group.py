"""An instance's seat in the membership group: which slots it holds, and since when.

Every instance joins one Kafka consumer group subscribed to the membership
topic, whose partitions are the ownership slots. The group coordinator assigns
them incrementally (the ``cooperative-sticky`` assignor, or the broker's own
under KIP-848: :mod:`~lakeprop.membership.protocol`); the consumer's heartbeats keep
the seat, and a member not heard from for ``session_timeout`` is dropped and
its slots go to the others. Nothing here is home-made consensus: who holds a
slot is whatever the coordinator last decided.

Three things are added on top, for the writes an owner makes:

* **Epochs.** Taking a slot, an instance appends a claim record to the slot's
  partition and keeps the record's offset as its epoch on the slot. Offsets
  only grow, so a later owner's epoch is always larger than an earlier one's,
  which is what a stale owner's write is told apart by.
* **A self-fence.** A thread of the seat beats every 0.1 s on the boot-time
  clock, which runs on while the process is stopped and while the machine is
  suspended (the monotonic clock stops with a suspended VM). A gap longer than the
  session timeout less two heartbeats (a long GC, ``SIGSTOP``) makes the seat
  suspect, and whichever thread runs first after the pause sees it:
  :meth:`Seat.holds` is false until the coordinator vouches for the seat again,
  by accepting a synchronous commit of its positions (only a member of the
  group gets that) or by a new assignment. An instance paused past its
  session timeout therefore stops believing it owns anything the moment it
  runs again, before its consumer learns that it was dropped.

A network partition is covered by librdkafka: a consumer that hears nothing from
the coordinator for ``session_timeout`` declares its partitions lost
(``on_lost``) by its own timer. That timer starts at the last answer it got,
no earlier than the coordinator's starts at the last heartbeat it got, so the
coordinator may move a slot a little before the partitioned instance lets go of
it. What the instance writes in between is fenced by Delta: the new owner
commits the old writer's transaction id before it writes anything, and Delta
skips the old writer's later commits, or fails one in flight.

A slot being revoked (another instance joined) is drained first: ``on_revoke``
runs inside the rebalance, and the coordinator gives the slot away only after
it returns.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from lakeprop.config import ClusterConfig, KafkaConfig
from lakeprop.kafka import settings
from lakeprop.membership import protocol
from lakeprop.membership.topics import (
    STATUS_SUFFIX,
    Claim,
    append_to_slots,
    ensure_topics,
    group_id,
    topic_identity,
    unreleased_writers,
)

log = logging.getLogger(__name__)


def _new_writer() -> str:
    return f"lakeprop-writer-{uuid.uuid4().hex}"


def boot_clock() -> float:
    """Seconds since boot, counting time the machine was suspended (Linux
    ``CLOCK_BOOTTIME``; the monotonic clock elsewhere)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class Seat:
    """This instance's membership: join, hold slots, confirm, leave.

    ``on_revoke(slots)`` runs on the seat's thread when the coordinator takes
    slots away in an orderly rebalance, and returns once nothing runs on them any
    more, or with the slots whose drain gave up (their release then says that
    this seat's writer may still write, so the next owner fences it);
    ``on_lost(slots)`` runs when the seat finds it was dropped
    (the slots are someone else's already). ``status()`` supplies what the seat
    publishes about the instance every ``heartbeat_interval`` (owned tables,
    lag), for ``lakeprop members``.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        cluster: ClusterConfig,
        *,
        on_revoke: Callable[[frozenset[int]], frozenset[int] | None] = lambda _slots: None,
        on_lost: Callable[[frozenset[int]], None] = lambda _slots: None,
        status: Callable[[], dict[str, Any]] = dict,
        clock: Callable[[], float] = boot_clock,
        era_of: Callable[[str], int] = lambda _identity: 0,
    ) -> None:
        self.kafka = kafka
        self.cluster = cluster
        self.topic = cluster.members_topic(kafka.topic)
        self.group = group_id(self.topic)
        self.instance = cluster.instance()
        self.on_revoke = on_revoke
        self.on_lost = on_lost
        self.status = status
        self.clock = clock
        self._claims: dict[int, Claim] = {}
        self._draining: set[int] = set()
        """Slots being revoked: nothing new starts on them, what ran may still be recorded."""
        self._lock = threading.Lock()
        self.writer = _new_writer()
        """This seat's writer id (Delta transaction app id): a new one after the seat was
        dropped, so that fencing an earlier one never fences this."""
        self._adopted: set[int] = set()
        """Slots whose predecessors were fenced by this seat (see :meth:`adopted`)."""
        self.era_of = era_of
        """The era of a membership topic identity (the shared catalog keeps them)."""
        self.era = 0
        """This seat's membership topic's era (:data:`~lakeprop.membership.topics.ERA_SPAN`),
        learned at :meth:`start`."""
        self._unclaimed: set[int] = set()
        """Slots assigned to this seat whose claim record was not written (the broker
        did not confirm it): claimed again at every heartbeat until it is."""
        self._last_tick = clock()
        """When the seat's clock thread last ran (:func:`boot_clock`)."""
        self._suspect = True
        """Set until the coordinator vouches for the seat (an assignment, a commit it
        accepted), and again after a pause long enough to have been dropped."""
        self.pause_limit = max(
            cluster.heartbeat_interval, cluster.session_timeout - 2 * cluster.heartbeat_interval
        )
        """A gap in the clock thread this long may have cost the seat its membership."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._meter: Any = None
        self._producer: Any = None

    # -- what the engine asks ---------------------------------------------------------

    def holds(self, slot: int) -> bool:
        """Whether this instance owns ``slot`` now, for new work: assigned, claimed, not
        being revoked, and confirmed within the session timeout."""
        with self._lock:
            return slot in self._claims and slot not in self._draining and self._live()

    def may_write(self, slot: int) -> Claim | None:
        """The claim under which this instance may record work on ``slot`` now (a slot
        being drained included); None when it may not."""
        with self._lock:
            return self._claims.get(slot) if self._live() else None

    def claims(self) -> dict[int, Claim]:
        """The slots held now, with their epochs (empty while the seat is unconfirmed)."""
        with self._lock:
            return dict(self._claims) if self._live() else {}

    def assigned(self) -> frozenset[int]:
        """The slots the coordinator last gave this seat, confirmed or not."""
        with self._lock:
            return frozenset(self._claims)

    def adopted(self, slots: Iterable[int]) -> None:
        """Note that this seat fenced the predecessors of ``slots`` (so a release of
        them says that its writer is done, and a later owner need not fence it)."""
        with self._lock:
            self._adopted.update(s for s in slots if s in self._claims)

    @property
    def vouched(self) -> bool:
        """False while the seat fences itself after a pause, until the coordinator
        vouches for it again."""
        return self._live()

    def _live(self) -> bool:
        """Not suspect, and not paused: whichever thread runs first after a pause sees
        the gap in the clock thread's ticks, before the clock thread itself does."""
        return not self._suspect and self.clock() - self._last_tick <= self.pause_limit

    def _tick(self) -> None:
        """The clock thread's beat: a gap longer than :attr:`pause_limit` since the last
        one (the process was stopped, or starved) makes the seat suspect."""
        now = self.clock()
        with self._lock:
            if now - self._last_tick > self.pause_limit and not self._suspect:
                log.warning(
                    "%s was paused for %.1fs: holding nothing until the group coordinator "
                    "confirms its membership",
                    self.instance,
                    now - self._last_tick,
                )
                self._suspect = True
            self._last_tick = now

    def end_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """The next offset of each partition of ``topic`` (for the lag this instance
        publishes; call it from :attr:`status`, which runs on the seat's thread)."""
        from confluent_kafka import TopicPartition

        return {
            p: self._meter.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
            for p in partitions
        }

    # -- joining and leaving ----------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Seat:
        from confluent_kafka import Consumer, Producer

        ensure_topics(self.kafka, self.cluster, timeout)
        self.era = self.era_of(topic_identity(self.kafka, self.topic, timeout))
        self._stop.clear()
        common = settings(self.kafka)
        self._producer = Producer({**common, "client.id": self.instance, "linger.ms": 0})
        protocol.configure_group(self.kafka, self.cluster, self.group, timeout)
        self._consumer = Consumer(
            {**common, **protocol.consumer_settings(self.cluster, self.instance, self.group)}
        )
        self._meter = Consumer(
            {**common, "group.id": f"{self.group}.meter", "client.id": self.instance}
        )
        """A consumer outside the group, for the change log's end offsets (the lag)."""
        self._consumer.subscribe(
            [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )
        self._thread = threading.Thread(target=self._run, name="lakeprop-membership", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Leave the group: the slots are drained (``on_revoke``) and released. A
        dynamic member's are handed over now; a static member's stay assigned to it
        for the session timeout, for its restart."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        """The seat's thread: polls, which runs the rebalance callbacks (heartbeats
        ride on librdkafka's own thread); every ``heartbeat_interval`` it asks the
        coordinator to vouch for a suspect seat and publishes the status. The
        consumer is used on this thread only."""
        from confluent_kafka import KafkaException

        consumer = self._consumer
        clock = threading.Thread(
            target=self._clock_loop, name="lakeprop-membership-clock", daemon=True
        )
        clock.start()
        next_beat = 0.0
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is not None and message.error() and message.error().fatal():
                    raise KafkaException(message.error())  # e.g. fenced by its instance id
                if self.clock() >= next_beat:
                    next_beat = self.clock() + self.cluster.heartbeat_interval
                    self._beat()
        except Exception:  # the seat is gone: hold nothing
            log.exception("membership seat of %s failed", self.instance)
            self._drop(self.on_lost)
        finally:
            clock.join()
            try:
                consumer.close()  # runs on_revoke for what is still held
            finally:
                self._drop(lambda _slots: None)
                self._producer.flush(5)
                self._meter.close()
                # librdkafka's clients live as long as a reference: let them go
                self._consumer = self._meter = self._producer = None

    def _beat(self) -> None:
        try:
            if self._suspect:
                self._confirm()
            self._claim_again()
            self._publish()
        except Exception:  # a status or a confirmation is tried again next time
            log.exception("membership heartbeat of %s failed", self.instance)

    def _clock_loop(self) -> None:
        """The clock thread: beats every 0.1 s, and does nothing else (so that a gap in
        its beats means the process was stopped or starved)."""
        while not self._stop.wait(0.1):
            self._tick()

    # -- the rebalance callbacks (on the seat's thread, inside poll) -------------------

    def _assigned(self, _consumer: Any, partitions: Iterable[Any]) -> None:
        slots = sorted(p.partition for p in partitions)
        with self._lock:  # the coordinator just gave this member a generation: it is live
            self._suspect = False
            self._last_tick = self.clock()
        claims = self._claim(slots)
        with self._lock:
            self._claims.update({c.slot: c for c in claims})
            self._unclaimed |= set(slots) - {c.slot for c in claims}
        log.info("%s holds slot(s) %s", self.instance, [c.slot for c in claims])

    def _claim_again(self) -> None:
        """Claim the assigned slots whose claim record did not land (at a heartbeat)."""
        with self._lock:
            slots = sorted(self._unclaimed)
        if not slots:
            return
        claims = self._claim(slots)
        with self._lock:
            taken = {c.slot: c for c in claims if c.slot in self._unclaimed}
            self._claims.update(taken)
            self._unclaimed -= set(taken)
        if taken:
            log.info("%s holds slot(s) %s after claiming them again", self.instance, sorted(taken))

    def _revoked(self, _consumer: Any, partitions: Iterable[Any]) -> None:
        slots = frozenset(p.partition for p in partitions)
        if not slots:
            return
        with self._lock:  # nothing new starts on them from now on
            self._draining |= slots
        log.info("%s gives up slot(s) %s", self.instance, sorted(slots))
        try:
            stuck = self.on_revoke(slots) or frozenset()
            if stuck:
                log.warning(
                    "%s gives up slot(s) %s without a clean drain: its next owner fences it",
                    self.instance,
                    sorted(stuck),
                )
            with self._lock:
                held = slots & set(self._claims)
                clean = sorted(held & self._adopted - stuck)
                unclean = sorted(held - (self._adopted - stuck))
            self._append(clean, {"kind": "release", "adopted": True})
            self._append(unclean, {"kind": "release", "adopted": False})
        finally:
            with self._lock:
                for slot in slots:
                    self._claims.pop(slot, None)
                self._draining -= slots
                self._adopted -= slots
                self._unclaimed -= slots

    def _lost(self, _consumer: Any, partitions: Iterable[Any]) -> None:
        slots = frozenset(p.partition for p in partitions)
        log.warning(
            "%s was dropped from the group; slot(s) %s are lost", self.instance, sorted(slots)
        )
        with self._lock:
            for slot in slots:
                self._claims.pop(slot, None)
            self._adopted -= slots
            self._draining -= slots
            self._unclaimed -= slots
            self.writer = _new_writer()  # whatever the old one wrote late is fenced
        self.on_lost(slots)

    def _drop(self, notify: Callable[[frozenset[int]], None]) -> None:
        with self._lock:
            slots = frozenset(self._claims)
            self._claims.clear()
            self._adopted.clear()
            self._draining.clear()
            self._unclaimed.clear()
            self._suspect = True
        if slots:
            notify(slots)

    def _claim(self, slots: list[int]) -> list[Claim]:
        """Append a claim record to each slot's partition; its offset is the epoch."""
        offsets = self._append(slots, {"kind": "claim"})
        return [Claim(slot, offsets[slot], self.era) for slot in slots if slot in offsets]

    def _append(self, slots: list[int], fields: dict[str, Any]) -> dict[int, int]:
        """Append a record (this seat, its writer, ``fields``) to each slot's partition
        and wait for them; the offset each got."""
        record = {
            **fields,
            "instance": self.instance,
            "writer": self.writer,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        return append_to_slots(
            self._producer, self.topic, self.instance, slots, record, self.cluster.session_timeout
        )

    def predecessors(self, claims: Iterable[Claim], timeout: float = 10.0) -> list[str]:
        """Writer ids that may still write for the claimed slots: those that claimed
        them before this seat since their last release (usually one each, or none)."""
        return unreleased_writers(self.kafka, self.topic, claims, timeout)

    def _confirm(self) -> bool:
        """Commit the held slots' positions, synchronously: the coordinator answers a
        live member with success, or with a rebalance under way (still a member);
        a member it dropped gets ``UNKNOWN_MEMBER_ID``."""
        from confluent_kafka import KafkaException, TopicPartition

        with self._lock:
            claims = list(self._claims.values())
        if not claims:
            return False
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, c.slot, c.epoch + 1) for c in claims],
                asynchronous=False,
            )
        except KafkaException as exc:
            error = exc.args[0]
            if not protocol.still_a_member(error.code()):
                log.info("membership of %s not confirmed: %s", self.instance, error)
                return False
        with self._lock:
            self._suspect = False
        log.info("membership of %s confirmed", self.instance)
        return True

    def _publish(self) -> None:
        """Tell ``lakeprop members`` about this instance (a compacted topic, by instance)."""
        claims = self.claims()
        try:
            extra = self.status()
        except Exception as exc:  # a status is best effort
            extra = {"status_error": str(exc)}
        record = {
            "instance": self.instance,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slots": sorted(claims),
            "epochs": {str(s): c.epoch for s, c in sorted(claims.items())},
            "heartbeat": time.time(),
            **extra,
        }
        self._producer.produce(
            self.topic + STATUS_SUFFIX, json.dumps(record).encode(), key=self.instance.encode()
        )
        self._producer.poll(0)
