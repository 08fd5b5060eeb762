"""Metrics read at scrape time from what the service holds in memory: per job, per
account, this instance's place in the cluster, and the streaming query's progress.
A scrape costs no Spark job."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from pyspark.sql.streaming.listener import StreamingQueryListener

from lakeprop.engine.model import TableRef
from lakeprop.engine.ownership import SlotOwner
from lakeprop.engine.scheduler import AccountLoad
from lakeprop.service.metric_defs import counter, counter_family, family, gauge, value_of
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.shared import conflicts_seen
from lakeprop.state.status import JobState

log = logging.getLogger("lakeprop.service.metrics")


class ClusterGauges(Collector):
    """This instance's place in the group, at scrape time: its slots, the tables and
    jobs it serves, whether it fences itself, whether it leads, and how often its
    shared state writes conflicted with other instances'."""

    def __init__(self, owner: SlotOwner, rows: Callable[[], Iterable[CatalogRow]]) -> None:
        self._owner = owner
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        owner, seat = self._owner, self._owner.seat
        served = owner.served()
        slots = family("lakeprop_cluster_slots")
        slots.add_metric(["assigned"], len(seat.assigned()))
        slots.add_metric(["served"], len(served))
        live = [r for r in self._rows() if r.is_live and owner.slot(r.database, r.table) in served]
        member = family("lakeprop_cluster_member")
        member.add_metric([owner.instance or ""], 1)
        yield member
        yield slots
        yield value_of("lakeprop_cluster_tables_served", len({(r.database, r.table) for r in live}))
        yield value_of("lakeprop_cluster_jobs_served", len(live))
        yield value_of("lakeprop_cluster_self_fenced", 0 if seat.vouched else 1)
        yield value_of("lakeprop_cluster_leader", 1 if owner.leads() else 0)
        conflicts = counter_family("lakeprop_state_write_conflicts")
        for table, count in sorted({"catalog": 0, **conflicts_seen()}.items()):
            conflicts.add_metric([table], count)
        yield conflicts


class AccountGauges(Collector):
    """Per account, at scrape time: iterations queued and running, rows and bytes in
    flight, and backpressure (since when paused; 0 when not)."""

    def __init__(self, accounts: Callable[[], Mapping[int, AccountLoad]]) -> None:
        self._accounts = accounts

    def collect(self) -> Iterator[Metric]:
        families = {
            "queued": family("lakeprop_account_iterations_queued"),
            "running": family("lakeprop_account_iterations_running"),
            "cached": family("lakeprop_account_rows_in_flight"),
            "bytes": family("lakeprop_account_bytes_in_flight"),
            "paused": family("lakeprop_account_paused_since_seconds"),
        }
        for account, load in self._accounts().items():
            label = [str(account)]
            families["queued"].add_metric(label, load.queued)
            families["running"].add_metric(label, load.running)
            families["cached"].add_metric(label, load.cached_rows)
            families["bytes"].add_metric(label, load.cached_bytes)
            families["paused"].add_metric(label, load.paused_since or 0.0)
        yield from families.values()


class JobGauges(Collector):
    """Per job, at scrape time: watermark, lag (versions and seconds) and state."""

    def __init__(
        self,
        rows: Callable[[], Mapping[Any, CatalogRow]],
        latest: Callable[[TableRef], int | None],
        commit_time: Callable[[TableRef, int], float | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._rows = rows
        self._latest = latest
        self._commit_time = commit_time
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        watermark = family("lakeprop_job_watermark")
        lag = family("lakeprop_job_lag_versions")
        lag_seconds = family("lakeprop_job_lag_seconds")
        state = family("lakeprop_job_state")
        jobs = family("lakeprop_jobs")
        by_state = dict.fromkeys((s.value for s in JobState), 0)
        now = self._clock()
        for row in list(self._rows().values()):
            if not row.is_live:
                continue
            labels = [
                str(row.account_id),
                row.database,
                row.table,
                row.job_name,
                str(row.job_id),
            ]
            by_state[row.job_state.value] += 1
            state.add_metric([*labels, row.job_state.value], 1)
            if row.watermark is None:
                continue
            watermark.add_metric(labels, row.watermark)
            table = TableRef(row.account_id, row.database, row.table)
            latest = self._latest(table)
            if latest is None:
                continue
            behind = max(0, latest - row.watermark)
            lag.add_metric(labels, behind)
            oldest = self._commit_time(table, row.watermark + 1) if behind else None
            lag_seconds.add_metric(labels, 0.0 if oldest is None else max(0.0, now - oldest))
        for name, count in by_state.items():
            jobs.add_metric([name], count)
        yield from (watermark, lag, lag_seconds, state, jobs)


class QueryProgress(StreamingQueryListener):
    """The streaming query's progress events, as metrics (method names are Spark's)."""

    def __init__(self, registry: CollectorRegistry, query_name: str) -> None:
        self.query_name = query_name
        self.batches = counter("lakeprop_query_batches", registry)
        self.input_rows = counter("lakeprop_query_input_rows", registry)
        self.batch_seconds = gauge("lakeprop_query_last_batch_seconds", registry)
        self.input_rate = gauge("lakeprop_query_input_rows_per_second", registry)
        self.batch_id = gauge("lakeprop_query_last_batch_id", registry)
        self.phase_seconds = gauge("lakeprop_query_phase_seconds", registry)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        self.batches.inc()
        self.input_rows.inc(progress.numInputRows)
        self.batch_seconds.set(progress.batchDuration / 1000.0)
        self.input_rate.set(progress.inputRowsPerSecond or 0.0)
        self.batch_id.set(progress.batchId)
        for phase, millis in (progress.durationMs or {}).items():
            self.phase_seconds.labels(phase).set(millis / 1000.0)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
