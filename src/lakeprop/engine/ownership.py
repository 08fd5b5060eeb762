"""Which source tables this instance serves, and how it signs what it writes.

:class:`SoleOwner` is the default: one instance serves every table and writes
the state tables alone. :class:`SlotOwner` serves the tables whose slots its
membership :class:`~lakeprop.membership.group.Seat` holds; the runner asks it
which tables to select, which results and verdicts to record, and which slots
to hand over or take over at the next micro-batch.

Signing is the fence against a stale owner. Every write of the catalog and the
iteration history carries this seat's writer id as a Delta transaction app id,
with a version that only grows; taking over a slot, the new owner first commits
that app id at the largest version to both tables for every writer that held
the slot before it without releasing it. Delta then skips any later write of
the old writer as already done, and fails one that was in flight with a
concurrent-transaction conflict (retried, and then skipped). The catalog rows
also carry ``owner = "<instance>@<epoch>"``, and a catalog write never replaces
a row written under a larger epoch.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from lakeprop.membership.group import Seat
from lakeprop.membership.slots import slot_of
from lakeprop.membership.topics import Claim

FENCE_VERSION = 2**62
"""The transaction version a new owner commits for a writer it fences."""


@dataclass(frozen=True)
class Signature:
    """How one write is signed: the writer's Delta transaction id and the owner column."""

    app_id: str
    version: int
    owner: str


@dataclass
class SlotChanges:
    """Slot changes the micro-batch thread has to act on."""

    revoking: frozenset[int] = frozenset()
    gained: dict[int, Claim] = field(default_factory=dict)
    lost: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.revoking or self.gained or self.lost)


class SoleOwner:
    """One instance: it serves every table and signs nothing."""

    instance: str | None = None
    slots = 1
    clustered = False

    def slot(self, database: str, table: str) -> int:
        return 0

    def serves(self, database: str, table: str) -> bool:
        return True

    def may_write(self, database: str, table: str) -> bool:
        return True

    def writes_slot(self, slot: int) -> bool:
        """Whether this instance records what happens on ``slot`` now."""
        return True

    def leads(self) -> bool:
        """Whether this instance does the cluster-wide chores (usage, accounts)."""
        return True

    def served(self) -> frozenset[int]:
        """The slots whose tables this instance serves now."""
        return frozenset({0})

    def explain(self, database: str, table: str) -> str:
        return "one instance"

    def sign(self, database: str | None = None, table: str | None = None) -> Signature | None:
        return None

    def owner_of(self, database: str, table: str) -> str | None:
        """The owner stamp of what this instance writes for the table (None: alone)."""
        return None

    def pending(self) -> SlotChanges:
        return SlotChanges()

    def fenced(self, claims: Iterable[Claim]) -> list[Signature]:
        """Signatures that fence the writers which held ``claims``' slots before."""
        return []

    def serve(self, slots: Iterable[int]) -> None:
        """The micro-batch thread reloaded these slots: serve their tables."""

    def adopt(self, slots: Iterable[int]) -> None:
        """The micro-batch thread also fenced these slots' predecessors."""

    def drained(self, slots: Iterable[int], clean: bool = True) -> None:
        """The micro-batch thread recorded what ran on these slots (``clean``: every
        iteration on them ended; else some may still write)."""

    def resume(self) -> None:
        """The query (re)starts."""

    def stop(self) -> None:
        """The query stopped."""


class SlotOwner(SoleOwner):
    """Serves the tables of the slots ``seat`` holds (see the module docstring)."""

    clustered = True

    def __init__(self, seat: Seat, drain_timeout: float = 120.0) -> None:
        self.seat = seat
        self.instance = seat.instance
        self.slots = seat.cluster.slots
        self.drain_timeout = drain_timeout
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self._served: set[int] = set()
        """Slots adopted by the micro-batch thread (durable state reloaded)."""
        self._revoking: set[int] = set()
        self._unclean: set[int] = set()
        """Slots drained without every iteration ending: their release says so."""
        self._lost: set[int] = set()
        self._drained = threading.Condition(self._lock)
        self._stopped = False
        seat.on_revoke = self._revoke
        seat.on_lost = self._lose

    def slot(self, database: str, table: str) -> int:
        return slot_of(database, table, self.slots)

    def serves(self, database: str, table: str) -> bool:
        slot = self.slot(database, table)
        with self._lock:
            adopted = slot in self._served
        return adopted and self.seat.holds(slot)

    def may_write(self, database: str, table: str) -> bool:
        return self.writes_slot(self.slot(database, table))

    def writes_slot(self, slot: int) -> bool:
        with self._lock:
            adopted = slot in self._served
        return adopted and self.seat.may_write(slot) is not None

    def leads(self) -> bool:
        return self.seat.holds(0)

    def served(self) -> frozenset[int]:
        with self._lock:
            adopted = set(self._served)
        return frozenset(s for s in adopted if self.seat.holds(s))

    def explain(self, database: str, table: str) -> str:
        """Why this instance may or may not write for the table now (for logs)."""
        slot = self.slot(database, table)
        with self._lock:
            adopted = slot in self._served
        return (
            f"slot {slot}: adopted={adopted}, assigned={slot in self.seat.assigned()}, "
            f"writable={self.seat.may_write(slot) is not None}"
        )

    def sign(self, database: str | None = None, table: str | None = None) -> Signature | None:
        claim = (
            None
            if database is None or table is None
            else self.seat.may_write(self.slot(database, table))
        )
        owner = self.instance if claim is None else f"{self.instance}@{claim.stamp}"
        with self._lock:
            version = next(self._versions)
        return Signature(self.seat.writer, version, owner or "")

    def owner_of(self, database: str, table: str) -> str | None:
        claim = self.seat.may_write(self.slot(database, table))
        return self.instance if claim is None else f"{self.instance}@{claim.stamp}"

    def fenced(self, claims: Iterable[Claim]) -> list[Signature]:
        writers = self.seat.predecessors(claims)
        return [Signature(w, FENCE_VERSION, "") for w in writers if w != self.seat.writer]

    # -- handover, between the seat's thread and the micro-batch thread ----------------

    def pending(self) -> SlotChanges:
        """What changed since the micro-batch thread last looked."""
        claims = self.seat.claims()
        with self._lock:
            gained = {s: c for s, c in claims.items() if s not in self._served}
            handover = SlotChanges(frozenset(self._revoking), gained, frozenset(self._lost))
            self._lost.clear()
            # a slot the seat no longer holds is not served, whatever happened to it
            self._served &= set(self.seat.assigned())
        return handover

    def serve(self, slots: Iterable[int]) -> None:
        taken = set(slots) & self.seat.assigned()  # some may have been revoked meanwhile
        with self._lock:
            self._served |= taken

    def adopt(self, slots: Iterable[int]) -> None:
        self.serve(slots)
        self.seat.adopted(set(slots) & self.seat.assigned())

    def drained(self, slots: Iterable[int], clean: bool = True) -> None:
        with self._lock:
            self._revoking -= set(slots)
            self._served -= set(slots)
            if not clean:
                self._unclean |= set(slots)
            self._drained.notify_all()

    def resume(self) -> None:
        with self._lock:
            self._stopped = False
            self._served.clear()
            self._revoking.clear()
            self._lost.clear()

    def stop(self) -> None:
        # a revocation waits for no micro-batch any more
        with self._lock:
            self._stopped = True
            self._drained.notify_all()

    def _revoke(self, slots: frozenset[int]) -> frozenset[int]:
        """On the seat's thread: wait until the micro-batch thread drained ``slots``;
        the slots whose drain gave up (timed out, or iterations still running)."""
        deadline = time.monotonic() + self.drain_timeout
        with self._lock:
            waiting = slots & self._served
            self._revoking |= waiting
            while self._revoking & waiting and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._drained.wait(left)
            stuck = (self._revoking & waiting) | (self._unclean & slots)
            self._revoking -= slots
            self._served -= slots
            self._unclean -= slots
        return frozenset(stuck)

    def _lose(self, slots: frozenset[int]) -> None:
        with self._lock:
            self._lost |= slots
            self._served -= slots
            self._revoking -= slots
            self._drained.notify_all()
