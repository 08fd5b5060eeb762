"""The consumer contract: what a consumer receives and what it must guarantee.

One consumer instance serves one job in one iteration. The engine calls exactly
one of its two methods:

``snapshot(rows, version)``
    ``rows`` is the whole source table as of Delta version ``version`` (initial
    sync, or a resync when the change feed can no longer be read). The consumer
    replaces its target with what these rows imply.

``apply_changes(changes, from_version, to_version)``
    ``changes`` holds the Change Data Feed rows of versions ``(from_version,
    to_version]``: the source columns plus ``_change_type`` (``insert``,
    ``update_preimage``, ``update_postimage``, ``delete``), ``_commit_version``
    and ``_commit_timestamp``. The consumer applies them in commit order.

Both return the number of rows written (for the iteration history). The
engine holds the DataFrames (a snapshot or a change set, checkpointed: its
rows are fixed, whatever reads them) and shares them with the other
consumers of the iteration: read them, do not unpersist them.

A consumer must

* be **idempotent**: the same call with the same ``to_version`` may come again
  after a crash, and must leave the target as one call would. Delta writes get
  that from :meth:`ConsumerContext.idempotent` (MERGE, UPDATE, DELETE) and
  :meth:`ConsumerContext.writer_options` (DataFrame writes);
* be **replay-tolerant** across ranges: after a crash between its write and the
  watermark update, it may get a range that overlaps the one it already applied;
* raise :class:`~lakeprop.errors.LakepropError` with a temporary code (1-9999)
  for trouble worth retrying and a permanent one (10000+) for trouble that needs
  a person; any other exception counts as temporary;
* know nothing of triggers, the scheduler or the catalog: the engine advances
  the job's watermark after ``snapshot`` or ``apply_changes`` returns;
* use ``context.spark`` (the worker's own session) for all Spark work, so that
  cancelling the iteration cancels its Spark jobs.

A consumer that can also apply a small change set in the driver, without Spark
(delta-rs; :mod:`lakeprop.consumers.native`), sets ``native = True`` and
implements ``apply_changes_native(changes, from_version, to_version)``, where
``changes`` is the same rows as an Arrow table (``_commit_timestamp`` as Spark's
change feed gives it). The engine decides which of the two methods a tail calls;
both must leave the target the same. ``why_not_native(fields)`` may keep a source's
tails on Spark (a column type it cannot take), saying why. One that can also
replace its target with a small table's rows in the driver sets
``native_snapshot = True`` and implements ``snapshot_native(rows, version)``, the
same rows as :meth:`Consumer.snapshot` gets, as an Arrow table.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakeprop.changes import Bounds, latest_change_per_key
from lakeprop.consumers.options import CHANGE_FEED
from lakeprop.errors import ErrorCode, InvalidConsumerOptionsError, PermanentError
from lakeprop.registry import JoinedSource
from lakeprop.spec import JobKey, target_table
from lakeprop.state.status import JoinedMark
from lakeprop.storage import Storage
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import CHANGE_FEED_PROPERTY

if TYPE_CHECKING:
    import pyarrow as pa

    from lakeprop.tables.resolve import TableHandle

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
MERGE_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


@dataclass(frozen=True)
class ConsumerContext:
    """Everything a consumer may use."""

    spark: SparkSession
    key: JobKey
    job_id: int
    consumer_type: str
    options: Mapping[str, Any]
    source_columns: tuple[str, ...]
    locate: Callable[[str, str], TableHandle]
    """(database, table) -> the table, bound to ``spark``."""
    cancelled: Callable[[], bool]
    """True once the iteration was cancelled; long Python loops should check it."""
    change_rows: int | None = None
    """Rows of the change set handed to ``apply_changes``, when the engine knows
    them (it counts the change set per version as it reads it): 0 means empty,
    so a consumer need not look; None means unknown."""
    generation: int = 0
    """The consumer's resync generation (``iteration.consumer.generation``)."""
    small: bool = False
    """The iteration read at most ``engine.small_iteration_rows`` rows: its Spark
    jobs cost more than its rows (see :meth:`merging_changes`)."""
    held_latest: Callable[[Sequence[str]], DataFrame] | None = None
    """The engine's last change per key of this member's change set, computed
    once for every consumer of the iteration with the same key and start and
    held (checkpointed); None where nothing holds it (:meth:`latest_changes`)."""
    storage: Storage = field(default_factory=Storage)
    """How delta-rs reaches the tables (:meth:`Storage.options` per location), for
    ``apply_changes_native`` and, with ``driver_reads``, on the Spark path."""
    driver_reads: bool = False
    """On the Spark path: the native path is on, so a consumer may read a table's
    log in the driver with delta-rs (``storage``) where that saves a Spark job."""
    keeps: str | None = None
    """The SQL condition of the job's ``drop`` rules (None: no rule drops): rows a
    consumer reads from the source itself, outside the change set it is handed,
    must meet it, or rows its target never held come back through them."""
    key_bounds: Bounds | None = None
    """Least and greatest value, in this member's change set, of the key columns
    its consumer type names (``Consumer.key_columns``), by lower-case column
    name; what :meth:`in_change_range` bounds a target by. None where the engine
    did not compute them (a snapshot, a context built outside the engine)."""
    joined: dict[str, JoinedMark] = field(default_factory=dict, compare=False, hash=False)
    """For a consumer with ``joined_sources``: the version (and identity) of each of
    them its write reflects, by ``database.table``, set by the consumer; the job's
    status keeps them, and the next iteration gets them back in ``joined_from``."""
    joined_from: Mapping[str, JoinedMark] = field(default_factory=dict)
    """What the job's last successful iteration left in ``joined`` (empty before its
    first, and when a resync starts it over)."""
    set_aside: list[DataFrame] = field(default_factory=list, compare=False, hash=False)
    """What the consumer quarantined (:meth:`quarantine`), for the engine to write."""

    def quarantine(self, rows: DataFrame) -> None:
        """Set ``rows`` aside to ``<target>__quarantine`` instead of writing them: the
        source's columns, ``__reason`` and ``__source_version`` (long; the version
        each row came in, or the snapshot's). The engine writes them after the
        consumer's write, with the rows the job's rules dropped, in one write that
        a replay does not repeat and a snapshot replaces the table with
        (:func:`lakeprop.engine.expect.quarantine`); a consumer never writes the
        quarantine itself."""
        self.set_aside.append(rows)

    @property
    def txn_app_id(self) -> str:
        """Delta transaction app id: one per job and consumer configuration.

        A new configuration (update_spec of the consumer) or a resync (a new
        generation) gets a new id, so its first snapshot is not mistaken for a
        write already done.
        """
        identity: list[Any] = [self.consumer_type, self.options]
        if self.generation:  # generation 0 keeps the ids of releases without it
            identity.append(self.generation)
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
        return f"lakeprop-{self.job_id}-{digest}"

    def writer_options(self, version: int) -> dict[str, str]:
        """Options that make a DataFrame write to Delta happen once per version."""
        return {"txnAppId": self.txn_app_id, "txnVersion": str(version)}

    @contextmanager
    def idempotent(self, version: int) -> Iterator[None]:
        """Make the Delta MERGE/UPDATE/DELETE inside happen once per version.

        The confs are per session, and every consumer runs on a session of its
        own, so no other thread sees them. They are unset on the way out.
        """
        self.spark.conf.set(TXN_APP_ID, self.txn_app_id)
        self.spark.conf.set(TXN_VERSION, str(version))
        try:
            yield
        finally:
            self.spark.conf.unset(TXN_APP_ID)
            self.spark.conf.unset(TXN_VERSION)

    def latest_changes(self, changes: DataFrame, key: Sequence[str]) -> DataFrame:
        """The last change of every key in ``changes``, the change set handed to
        ``apply_changes`` (:func:`~lakeprop.changes.latest_change_per_key`).

        Where the engine holds it (a large iteration) it was computed once for
        all the consumers with this key and start, so K replicas of a table pay
        for one shuffle, not K, and a MERGE reading it need not copy it first
        (:meth:`merging_changes`). Otherwise (a small iteration, no engine
        behind the context) it is computed here, as part of the query that
        reads it.
        """
        if self.held_latest is None:
            return latest_change_per_key(changes, list(key))
        return self.held_latest(key)

    def in_change_range(self, columns: Sequence[str], alias: str | None = None) -> list[Column]:
        """Predicates on the target's key ``columns`` (of ``alias``): each between
        the least and greatest value the change set holds of it.

        ANDed into a MERGE's ``ON`` condition (or a filter on the target), they
        let Delta skip every target file whose statistics lie outside the range
        (data skipping), so a tail of recent keys reads the files holding them,
        not the whole target. They lose no match: every key of the change set
        lies inside. Only columns matched by equality belong here (a NULL-safe
        match would lose its NULL keys), and only those the consumer type names
        in ``key_columns``: the others have no bounds and get no predicate.
        """
        bounds = self.key_bounds or {}
        prefix = f"{alias}." if alias else ""
        predicates = []
        for column in columns:
            found = bounds.get(column.lower())
            if found is not None:
                low, high = found
                predicates.append(F.col(f"{prefix}{column}").between(F.lit(low), F.lit(high)))
        return predicates

    @contextmanager
    def merging_changes(self) -> Iterator[None]:
        """For a Delta MERGE inside whose source is :meth:`latest_changes` (or
        made of the change set alone, with nothing else read).

        Delta copies a MERGE source it cannot prove fixed before its two passes.
        Here the source is fixed: held by the engine in a large iteration (so
        the copy would only store the same rows twice), and in a small one the
        checkpointed change set itself, read twice (a Spark job less than the
        copy). Only with no engine holding it and a large change set is the copy
        kept, because there it pays: it holds the last change per key once
        computed, which both passes would otherwise compute again. A source that
        reads anything else (another table, a cached DataFrame) must not use this.
        """
        if not self.small and self.held_latest is None:
            yield
            return
        with self.merging_held():
            yield

    @contextmanager
    def merging_held(self) -> Iterator[None]:
        """For a Delta MERGE inside whose source the consumer holds itself (a local
        checkpoint it made, of rows that no longer change): Delta need not copy
        it for its two passes."""
        before = self.spark.conf.get(MERGE_MATERIALIZE_SOURCE, None)
        self.spark.conf.set(MERGE_MATERIALIZE_SOURCE, "none")
        try:
            yield
        finally:
            if before is None:
                self.spark.conf.unset(MERGE_MATERIALIZE_SOURCE)
            else:
                self.spark.conf.set(MERGE_MATERIALIZE_SOURCE, before)


class Consumer(ABC):
    """Base class of every consumer, built-in or not; see the module docstring.

    Subclasses override the two class methods to validate their options when a
    job is registered, and implement :meth:`snapshot` and :meth:`apply_changes`.
    The base does the chores most of them share: the target table
    (``target_database`` / ``target_table`` options or ``<table>_<job name>``),
    the check that it still exists, the idempotent snapshot overwrite, and the
    last version a MERGE already applied to it.
    """

    native: ClassVar[bool] = False
    """Whether :meth:`apply_changes_native` applies a small change set without Spark."""
    native_snapshot: ClassVar[bool] = False
    """Whether :meth:`snapshot_native` replaces the target with a small table's rows
    without Spark."""
    table_target: ClassVar[bool] = True
    """Whether the target is a Delta table other jobs may read as their source. Its
    change feed is on unless the job's ``change_feed`` option turns it off
    (:meth:`overwrite` sees to it)."""
    commit_timestamps: ClassVar[bool] = False
    """Whether its native path reads ``_commit_timestamp``: the engine then gives the
    change set the timestamps Spark's change feed has (a few log reads more)."""

    def __init__(self, context: ConsumerContext) -> None:
        self.context = context
        self.__target: TableHandle | None = None  # mangled: subclasses keep the name _target

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Normalised options, or raise InvalidConsumerOptionsError. Default: any JSON."""
        try:
            json.dumps(dict(options))
        except (TypeError, ValueError) as exc:
            raise InvalidConsumerOptionsError(f"options must be plain JSON: {exc}") from None
        return dict(options)

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        """Source columns the options rely on (checked at registration)."""
        return []

    @classmethod
    def check_source(
        cls, options: Mapping[str, Any], schema: StructType, spark: SparkSession
    ) -> None:
        """Check the (validated) options against the source's schema at registration,
        where the column names of :meth:`source_columns` do not say enough (types,
        SQL expressions); raise InvalidConsumerOptionsError. ``spark`` is for Spark's
        parser and analyzer only: launch no job. Default: nothing more."""
        return None

    @classmethod
    def joined_sources(cls, options: Mapping[str, Any]) -> list[JoinedSource]:
        """Tables the (validated) options read beside the job's own source, with the
        columns each must have (a join). Each is checked at registration; a commit
        on any of them makes the job due, and its iteration tells the engine the
        versions of them its write reflects (:attr:`ConsumerContext.joined`).
        Default: none."""
        return []

    @classmethod
    def own_source(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        """The (database, table) the options name as the job's own source (a join's
        first table): registering the job on another table is refused. Default: None,
        any table."""
        return None

    @classmethod
    def key_columns(cls, options: Mapping[str, Any]) -> list[str]:
        """Source columns ``apply_changes`` matches the target on, by equality and
        under the same names in the target. The engine bounds them by the change
        set as it reads it (no Spark job of its own) for
        :meth:`ConsumerContext.in_change_range`. Default: none."""
        return []

    @property
    def target(self) -> TableHandle:
        """The job's target table, bound to the worker's session."""
        if self.__target is None:
            self.__target = self.context.locate(
                *target_table(self.context.key, self.context.options)
            )
        return self.__target

    def require_target(self) -> TableHandle:
        """The target, or a permanent error when it was dropped under the job."""
        if not self.target.exists():
            raise PermanentError(
                f"{self.context.consumer_type} target {self.target} is missing; re-register "
                "the job to rebuild it",
                ErrorCode.TARGET_MISSING,
            )
        return self.target

    @property
    def change_feed(self) -> bool:
        """Whether the target keeps a change feed, for jobs that read it (on unless
        the ``change_feed`` option says false)."""
        return self.table_target and self.context.options.get(CHANGE_FEED, True) is not False

    def overwrite(self, data: DataFrame, version: int) -> None:
        """Replace the target with ``data``, once per ``version`` (a snapshot's write),
        its change feed on unless the job turned it off."""
        writer = (
            data.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .options(**self.context.writer_options(version))
        )
        if self.change_feed:
            writer = writer.option(CHANGE_FEED_PROPERTY, "true")
        self.target.save(writer)
        if self.change_feed:
            self.target.keep_change_feed()

    def written_columns(self) -> list[str]:
        """The target columns a tail writes, for the source's columns in the context
        (the engine checks that a target has them before it writes natively)."""
        return []

    def applied_version(self) -> int | None:
        """The last version this job's idempotent writes committed to the target, if any."""
        return DeltaLogProbe(self.context.spark).last_transaction(
            self.target.location(), self.context.txn_app_id
        )

    @abstractmethod
    def snapshot(self, rows: DataFrame, version: int) -> int:
        """Replace the target with what the source holds at ``version``."""

    @abstractmethod
    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        """Apply the changes of versions ``(from_version, to_version]``."""

    def why_not_native(self, fields: Sequence[tuple[str, Any]]) -> str | None:
        """Why a consumer with a native path cannot take this source's (name, delta-rs
        type) columns natively (the iteration runs on Spark, saying so); None when it can."""
        return None

    def apply_changes_native(self, changes: pa.Table, from_version: int, to_version: int) -> int:
        """Apply the same changes, given as an Arrow table, in the driver (``native``)."""
        raise NotImplementedError(f"{type(self).__name__} has no native path")

    def snapshot_native(self, rows: pa.Table, version: int) -> int:
        """Replace the target with ``rows`` (the source as of ``version``, as Arrow) in
        the driver (``native_snapshot``), as :meth:`snapshot` does on Spark."""
        raise NotImplementedError(f"{type(self).__name__} has no native snapshot")
