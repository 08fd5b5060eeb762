"""Which tables a tick probes when writers announce their commits (pure, no Spark).

The lakehouse form of ISCP's dirty-table RPC: a writer announces "table T
reached version v" (:mod:`lakeprop.notifications`), and a tick probes a table's
Delta log only when

* one of its eligible jobs has no watermark yet (it needs the latest version),
* a version past the lowest eligible watermark is known: announced by a writer,
  or seen by an earlier probe (a chunked catch-up goes on without a new
  announcement),
* the table was not probed since the service started, or an iteration of this
  service wrote it (it is another job's target: :meth:`DirtyTables.touch`), or
* its sweep is due: every table is probed at least once per ``sweep_interval``,
  which finds the commits of writers that announce nothing.

An announcement the log does not bear out (a version past the latest, sent
before the probe began) is dropped: writers announce after they commit.
Announcements arrive on a listener thread; everything else runs on the
micro-batch thread.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass

TableName = tuple[str, str]
"""(database, table): how writers name a table (a job key adds the account)."""


@dataclass(frozen=True)
class _Announced:
    version: int
    at: float


class DirtyTables:
    """What writers announced and what probes saw, per table."""

    def __init__(self, sweep_interval: float) -> None:
        self.sweep_interval = sweep_interval
        self._lock = threading.Lock()
        self._announced: dict[TableName, _Announced] = {}
        self._seen: dict[TableName, int] = {}
        self._next_sweep: dict[TableName, float] = {}
        self.announcements = 0
        """Announcements received since the service started (metrics)."""

    def reset(self) -> None:
        """Forget everything: every table is probed again (a start, a restart)."""
        with self._lock:
            self._announced.clear()
            self._seen.clear()
            self._next_sweep.clear()

    def announce(self, table: TableName, version: int, at: float) -> None:
        with self._lock:
            self.announcements += 1
            known = self._announced.get(table)
            if known is None or version > known.version:
                self._announced[table] = _Announced(version, at)

    def due(self, table: TableName, since: int | None, now: float) -> bool:
        """Whether to probe ``table`` whose lowest eligible watermark is ``since``
        (None: a job without one)."""
        if since is None:
            return True
        next_sweep = self._next_sweep.get(table)
        if next_sweep is None or now >= next_sweep:
            return True
        with self._lock:
            announced = self._announced.get(table)
        known = max(self._seen.get(table, -1), -1 if announced is None else announced.version)
        return known > since

    def touch(self, table: TableName) -> None:
        """A job of this service wrote ``table`` (another job's source): probe it at
        the next tick, as if it had not been probed since the start. Called on the
        micro-batch thread, like the probes."""
        self._next_sweep.pop(table, None)

    def next_sweep(self, table: TableName) -> float:
        """When ``table``'s sweep is due (0: it was not probed since the start)."""
        return self._next_sweep.get(table, 0.0)

    def probed(self, table: TableName, latest: int | None, started: float) -> None:
        """Record a probe begun at ``started`` that found ``latest`` (None: no table)."""
        self._next_sweep[table] = started + self.sweep_interval * _spread(table)
        if latest is None:
            self._seen.pop(table, None)
        else:
            self._seen[table] = latest
        with self._lock:
            announced = self._announced.get(table)
            if announced is None:
                return
            if latest is not None and announced.version <= latest:
                del self._announced[table]  # borne out: the seen version covers it
            elif announced.at < started:
                del self._announced[table]  # announced before the probe, not in the log


def _spread(table: TableName) -> float:
    """0.75..1.0, fixed per table: sweeps of many tables spread over the interval."""
    digest = zlib.crc32(f"{table[0]}.{table[1]}".encode())
    return 0.75 + 0.25 * (digest / 0xFFFFFFFF)
