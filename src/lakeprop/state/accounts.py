"""The ``accounts`` table: each account's share of the service, as last published.

One row per account with iterations queued or running, or paused by
backpressure: how many are queued and running, the rows its running
iterations hold in flight and their bytes in Spark's cache, since when it
has been paused (null: not paused), since when its oldest queued iteration
has waited, and when the row was published. The service overwrites the
whole table (one commit, on a thread of its own) every
``engine.status_flush_interval`` when the loads changed, and once more at
shutdown, so a reader sees an account's state as of ``updated_at``; the live
figures are the ``lakeprop_account_*`` gauges.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from lakeprop.state import store as state
from lakeprop.state.schema import Int32, row_tuple, spark_schema
from lakeprop.tables.probe import DeltaLogProbe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AccountRow:
    """One account's load: a row of :data:`ACCOUNTS_SCHEMA`."""

    account_id: int
    queued: Int32
    running: Int32
    rows_in_flight: int
    bytes_in_flight: int
    paused_since: datetime | None
    """Since when backpressure has held its new iterations (None: not paused)."""
    waiting_since: datetime | None
    """Since when its oldest queued iteration has waited (None: nothing queued)."""
    updated_at: datetime

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


ACCOUNTS_SCHEMA = spark_schema(AccountRow)


class AccountsTable:
    """Publishes the account loads, one overwrite when they changed."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self._published: tuple[AccountRow, ...] | None = None
        """What the table holds (``updated_at`` aside); None: not known yet."""
        self._writing: threading.Thread | None = None

    def holds(self, rows: Sequence[AccountRow]) -> bool:
        """Whether the table is known to hold ``rows`` (``updated_at`` aside)."""
        return self._published == _loads(rows)

    def publish(self, rows: Sequence[AccountRow], background: bool = False) -> bool:
        """Overwrite the table with ``rows`` unless it holds them already; True when
        written (or, with ``background``, when a write of them started on a thread
        of its own; False then also while the previous one still runs). Before the
        first write the table is known to hold nothing only when it does not exist
        (a listing of its log, no Spark job)."""
        if self._writing is not None and self._writing.is_alive():
            if background:
                return False
            self._writing.join()
        loads = _loads(rows)
        if self._published is None and DeltaLogProbe(self.spark).latest_version(self.path) is None:
            self._published = ()
        if loads == self._published:
            return False
        self._published = loads

        def write() -> None:
            try:
                frame = self.spark.createDataFrame([r.as_tuple() for r in rows], ACCOUNTS_SCHEMA)
                frame.write.format("delta").mode("overwrite").save(self.path)
            except Exception:
                self._published = None  # not known: written again next time
                if not background:
                    raise
                log.warning("publishing the account loads failed", exc_info=True)

        if background:
            self._writing = threading.Thread(target=write, name="lakeprop-accounts", daemon=True)
            self._writing.start()
        else:
            write()
        return True

    def read(self) -> list[AccountRow]:
        """The rows as last published (none when never published)."""
        if DeltaLogProbe(self.spark).latest_version(self.path) is None:
            return []
        rows = state.read_table(self.spark, self.path).collect()
        return sorted((AccountRow(**r.asDict()) for r in rows), key=_key)


def _key(row: AccountRow) -> int:
    return row.account_id


def _loads(rows: Sequence[AccountRow]) -> tuple[AccountRow, ...]:
    """The rows as the table holds them, for comparison: sorted, ``updated_at`` aside."""
    return tuple(sorted((replace(r, updated_at=datetime.min) for r in rows), key=_key))
