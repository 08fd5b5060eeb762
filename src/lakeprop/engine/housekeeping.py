"""Housekeeping on intervals: flush in-memory catalog changes, collect dropped jobs.

ISCP keeps watermarks in memory and flushes them periodically. Here memory
holds the watermarks iterations advanced (durable already in the iteration
history), the ``watermark_ts`` of idle jobs found fresh by trigger selection,
and the transient pending/running states. One catalog commit writes them: every
``engine.status_flush_interval`` while a watermark or status has advanced, and
every ``engine.watermark_flush_interval`` otherwise, on a thread of its own
so that the micro-batch does not wait for a write of the whole table. Dropped
jobs stay in the catalog for ``engine.gc_retention`` and are then deleted, every
``engine.gc_interval``. The usage table is recomputed from the history every
``engine.usage_refresh_interval`` (:mod:`lakeprop.state.usage`), and the
account loads are published to the ``accounts`` table every
``engine.status_flush_interval`` when they changed (:mod:`lakeprop.state.accounts`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from lakeprop.config import EngineConfig
from lakeprop.engine.scheduler import AccountLoad
from lakeprop.faults import fault_point
from lakeprop.spec import JobRef
from lakeprop.state.accounts import AccountRow, AccountsTable
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.usage import UsageTable

log = logging.getLogger(__name__)


class Housekeeping:
    def __init__(
        self,
        catalog: JobCatalog,
        engine: EngineConfig,
        clock: Callable[[], float],
        usage: UsageTable | None = None,
        accounts: AccountsTable | None = None,
        loads: Callable[[], dict[int, AccountLoad]] = dict,
        leads: Callable[[], bool] = lambda: True,
    ) -> None:
        self.catalog = catalog
        self.leads = leads
        """Whether this instance refreshes the usage and accounts tables (with several
        instances, the one holding slot 0 does)."""
        self.usage = usage
        self.accounts = accounts
        self.loads = loads
        self.engine = engine
        self._last_flush = clock()
        self._last_usage = self._last_flush
        self._last_accounts = 0.0  # at the first run: then the published loads are known
        self._last_gc = 0.0

    def run(self, now: float) -> list[JobRef]:
        """Flush and collect when their intervals have passed; the jobs collected."""
        since = now - self._last_flush
        interval = self.engine.watermark_flush_interval
        if self.catalog.behind:
            interval = min(interval, self.engine.status_flush_interval)
        self.catalog.settle()
        if since >= interval:
            fault_point("watermarks.flush")
            flushed = self.catalog.flush_in_background()
            self._last_flush = now
            if flushed:
                log.info("flushing %d job(s) changed in memory to the catalog", flushed)
        leads = self.leads()
        if (
            leads
            and self.usage is not None
            and now - self._last_usage >= self.engine.usage_refresh_interval
        ):
            self.usage.refresh()
            self._last_usage = now
        if leads and now - self._last_accounts >= self.engine.status_flush_interval:
            self.publish_accounts(now, background=True)
        if now - self._last_gc < self.engine.gc_interval:
            return []
        self._last_gc = now
        return self.collect_garbage(now)

    def next_at(self, now: float) -> float:
        """When :meth:`run` next has something to do: a flush, a refresh of the usage
        table (when hours are pending), a publication of changed account loads, a
        collection of dropped jobs."""
        interval = self.engine.watermark_flush_interval
        if self.catalog.behind:
            interval = min(interval, self.engine.status_flush_interval)
        times = [self._last_flush + interval, self._last_gc + self.engine.gc_interval]
        if self.leads():
            if self.usage is not None and self.usage.pending:
                times.append(self._last_usage + self.engine.usage_refresh_interval)
            if self.accounts is not None and not self.accounts.holds(
                account_rows(self.loads(), now)
            ):
                times.append(self._last_accounts + self.engine.status_flush_interval)
        return min(times)

    def publish_accounts(self, now: float, background: bool = False) -> None:
        """Publish the account loads (a commit only when they changed), with
        ``background`` on a thread of its own."""
        self._last_accounts = now
        if self.accounts is not None:
            self.accounts.publish(account_rows(self.loads(), now), background)

    def collect_garbage(self, now: float) -> list[JobRef]:
        """Remove catalog rows of jobs dropped longer than the retention ago."""
        cutoff = datetime.fromtimestamp(now - self.engine.gc_retention)
        doomed = self.catalog.dropped_before(cutoff)
        if doomed:
            fault_point("gc.run")
        self.catalog.delete(doomed)
        if doomed:
            log.info("garbage-collected %d dropped job(s)", len(doomed))
        return doomed


def account_rows(loads: dict[int, AccountLoad], now: float) -> list[AccountRow]:
    """The ``accounts`` table rows of the scheduler's account loads at ``now``."""

    def moment(at: float | None) -> datetime | None:
        return None if at is None else datetime.fromtimestamp(at)

    updated = datetime.fromtimestamp(now)
    return [
        AccountRow(
            account,
            load.queued,
            load.running,
            load.cached_rows,
            load.cached_bytes,
            moment(load.paused_since),
            moment(load.waiting_since),
            updated,
        )
        for account, load in sorted(loads.items())
    ]
