"""What a runner is built from (:class:`~lakeprop.service.runner.Runner`): the
service's wiring (:mod:`lakeprop.service.app`) hands it over in one value."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from lakeprop.bulk.executor import BulkExecutor
from lakeprop.config import EngineConfig
from lakeprop.engine.dirty import DirtyTables
from lakeprop.engine.ownership import SoleOwner
from lakeprop.engine.scheduler import Scheduler
from lakeprop.notifications import CommitNotice
from lakeprop.service.observer import RunnerObserver, Unobserved
from lakeprop.state.accounts import AccountsTable
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.history import IterationHistory
from lakeprop.state.outcomes import OutcomeTables
from lakeprop.state.usage import UsageTable
from lakeprop.storage import Storage
from lakeprop.tables.resolve import Tables
from lakeprop.tenants import Tenants


@dataclass(frozen=True)
class RunnerParts:
    """What a runner works with: the worker session, the engine's settings, the
    state tables, the tables, the scheduler, and the parts a service may leave
    out (notifications, tenants, usage, accounts, bulk operations, an observer)."""

    spark: SparkSession
    engine: EngineConfig
    catalog: JobCatalog
    outcomes: OutcomeTables
    tables: Tables
    history: IterationHistory
    scheduler: Scheduler
    max_message_bytes: int
    clock: Callable[[], float] = time.time
    dirty: DirtyTables | None = None
    """Tables announced by commit notifications (None: notifications off)."""
    tenants: Tenants = field(default_factory=Tenants)
    usage: UsageTable | None = None
    accounts: AccountsTable | None = None
    bulk: BulkExecutor | None = None
    observer: RunnerObserver = field(default_factory=Unobserved)
    log_empty: Callable[[int], bool] = lambda _batch_id: False
    """Whether a micro-batch is known to hold no change log record (then it is not
    collected: no Spark job); see :class:`~lakeprop.service.stream.ChangelogOffsets`."""
    ownership: SoleOwner = field(default_factory=SoleOwner)
    """Which tables this instance serves (all of them, unless ``cluster.enabled``)."""
    storage: Storage = field(default_factory=Storage)
    """How delta-rs reaches the tables, and where its commits exclude Spark's."""
    tick_interval: float = 10.0
    """How often work with a time runs at most (:func:`~lakeprop.service.wake.next_batch_at`)."""
    announce: Callable[[CommitNotice], None] | None = None
    """Where a write to a table other jobs read is announced (with ``cluster.enabled``
    and notifications on: :class:`~lakeprop.service.notices.NoticePublisher`)."""
    poll_interval: float = 1.0
    """How often the query polls the broker (the wake of a tick is written that early)."""
