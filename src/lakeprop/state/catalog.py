"""The job catalog: one Delta row per job, modelled on ``mo_iscp_log``.

Columns follow MatrixOne's ``mo_iscp_log`` (account id, table identity, job
name, job id, job spec, job state, watermark, job status, create and drop time)
plus the Kafka coordinates of the last change log message applied to the row,
which is what makes applying the log idempotent: a message at or below those
coordinates has already been applied and is skipped (:mod:`lakeprop.state.apply`).

:class:`CatalogRow` is one row; :class:`JobCatalog` keeps the rows in memory
and writes changes to Delta.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from functools import partial
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql.types import IntegerType, StructField, StructType

from lakeprop.errors import InvalidConfigError
from lakeprop.membership.slots import slot_of
from lakeprop.spec import JobRef
from lakeprop.state import store as state
from lakeprop.state.job_row import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.shared import Signed, conflicting, signed_session, with_retries

log = logging.getLogger(__name__)


class RowScope(Enum):
    """Whether an instance sharing the catalog writes a row now (``cluster.enabled``)."""

    WRITE = "write"
    """Its table is served here: write it."""
    DEFER = "defer"
    """Its table is assigned here but not writable this moment: keep it for later."""
    SKIP = "skip"
    """Another instance serves its table and writes it."""


@dataclass(frozen=True)
class SharedWrites:
    """How an instance writes its rows of a catalog that several instances share:
    which rows (``scope``), stamped how (``owner``), signed how (``sign``)."""

    scope: Callable[[CatalogRow], RowScope]
    owner: Callable[[CatalogRow], str]
    sign: Callable[[], Signed]


KEY_COLUMNS = ("account_id", "database", "table", "job_name", "job_id")
ERA_PROPERTY = "lakeprop.cluster.era"
MEMBERSHIP_PROPERTY = "lakeprop.cluster.membership"
"""The catalog's properties: the membership topic's era, and the topic it counts for."""
SLOT = "slot"
TABLE_SCHEMA = StructType([*CATALOG_SCHEMA.fields, StructField(SLOT, IntegerType(), False)])
"""The catalog table: the rows and, as its partition column, the slot of each row's
source table under the table's layout (so instances serving different slots write
different partitions, and their MERGEs never conflict)."""
LAYOUT_PROPERTY = "lakeprop.catalog.slots"
"""The table property naming the slot count its partitions are laid out for."""
LAYOUT_APP_ID = "lakeprop.catalog.layout"
"""The Delta transaction id of a re-layout for a shared catalog, at its membership
era: of instances starting together on a new topic one lays the table out, and
Delta skips the others' re-layouts as done."""
_EPOCH = "coalesce(try_cast(substring_index({0}.owner, '@', -1) AS BIGINT), -1)"
NOT_OLDER = f"{_EPOCH.format('t')} <= {_EPOCH.format('s')}"
"""A shared-catalog write replaces no row written under a larger epoch."""


@dataclass
class _Flush:
    """A flush writing on a thread of its own (see :meth:`JobCatalog.flush_in_background`)."""

    base: int
    """The catalog's write count when its content was taken."""
    content: dict[JobRef, CatalogRow]
    rows: dict[JobRef, CatalogRow]
    """The rows it writes that memory held only."""
    thread: threading.Thread | None = None
    deferred: set[JobRef] = field(default_factory=set)
    """Rows a shared catalog kept for a later write (:attr:`RowScope.DEFER`)."""
    written_as: int | None = None
    """Its write's number; None when it did not write (a later content went first)."""
    error: BaseException | None = None


class JobCatalog:
    """The catalog rows in memory, backed by a Delta table (the durable truth).

    Only the micro-batch thread changes it; a status flush may write the table
    from a thread of its own (:meth:`flush_in_background`), never its memory.
    Changes that must be durable (the change log's, an error) are staged in
    memory and written with one commit at the end of the micro-batch
    (:meth:`commit_staged`); if that write fails the query fails and a restart
    reloads the table. Changes that need not be
    durable at once stay in memory until :meth:`flush`, as ISCP's in-memory
    watermark does: a fresh watermark time of an idle job, a transient state,
    and an advanced watermark, whose durable record is the iteration history
    (:meth:`remember` with ``progress``). Every write is of the whole table, so
    a commit takes along whatever memory holds.
    """

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        shared: SharedWrites | None = None,
        slots: int | None = None,
    ) -> None:
        self.spark = spark
        self.path = path
        self.shared = shared
        """Set when several instances share the table: each MERGEs its own rows."""
        self.slots = slots
        """The layout a shared catalog needs (``cluster.slots``); None: one instance,
        which keeps the layout the table has."""
        self.layout = slots or 1
        """The slot count the table is laid out for (:data:`LAYOUT_PROPERTY`)."""
        self._laid_out = shared is None
        """Whether :attr:`layout` is the table's (a shared catalog learns it in :meth:`era`)."""
        self._session = spark.newSession() if shared is not None else spark
        """Where shared writes set their transaction confs (writes are serialized)."""
        self._rows: dict[JobRef, CatalogRow] = {}
        self._durable: dict[JobRef, CatalogRow] = {}
        """The rows as the Delta table holds them."""
        self._dirty: set[JobRef] = set()
        self._progress: set[JobRef] = set()
        """Dirty rows whose watermark or status advanced (flushed more often)."""
        self._staged: set[JobRef] = set()
        self._created = False
        self._write_lock = threading.RLock()
        self._writes = 0
        """Writes of the table so far (under the lock)."""
        self._flushing: _Flush | None = None

    def ensure(self) -> None:
        self._created = state.ensure_table(
            self.spark,
            self.path,
            TABLE_SCHEMA,
            {LAYOUT_PROPERTY: str(self.layout)},
            partitioned_by=(SLOT,),
        )

    def load(self) -> None:
        """Read every row from Delta (at start-up; afterwards memory is kept in step).

        One instance keeps the table's layout, and lays a table of an earlier release
        (not partitioned) out for one slot; a shared catalog is laid out in :meth:`era`.
        """
        rows = [] if self._created else state.read_table(self.spark, self.path).collect()
        self._rows = {r.row_id: r for r in map(CatalogRow.from_spark, rows)}
        self._durable = dict(self._rows)
        if self._created or self.shared is not None:
            return
        found = self._found_layout()
        if found is None:
            self._lay_out(1, None)
        else:
            self.layout = found

    def _found_layout(self) -> int | None:
        """The slot count the table is partitioned for; None for a table of an earlier
        release (not partitioned by slot)."""
        from delta.tables import DeltaTable

        detail = DeltaTable.forPath(self.spark, self.path).detail().first()
        if detail is None or list(detail["partitionColumns"] or []) != [SLOT]:
            return None
        recorded = dict(detail["properties"] or {}).get(LAYOUT_PROPERTY)
        return None if recorded is None else int(recorded)

    def _stored(self, row: CatalogRow, layout: int) -> tuple[Any, ...]:
        """``row`` as the table holds it: its columns and its slot under ``layout``."""
        return (*row.as_tuple(), slot_of(row.database, row.table, layout))

    def _lay_out(self, slots: int, era: int | None) -> None:
        """Rewrite the table partitioned for ``slots``, rows unchanged, and record the
        layout. A shared catalog's re-layout carries :data:`LAYOUT_APP_ID` at ``era``,
        so of instances starting together on a new membership topic one rewrites it
        and Delta skips the rest; the rows' slots are then checked, not trusted."""
        rows = [CatalogRow.from_spark(r) for r in state.read_table(self.spark, self.path).collect()]
        frame = self.spark.createDataFrame([self._stored(r, slots) for r in rows], TABLE_SCHEMA)
        writer = (
            frame.coalesce(1)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .partitionBy(SLOT)
        )
        if era is not None:
            writer = writer.options(txnAppId=LAYOUT_APP_ID, txnVersion=str(era))
        with_retries(
            f"catalog layout of {self.path}",
            partial(writer.save, self.path),
            table="catalog_layout",
        )
        placed = state.read_table(self.spark, self.path).select("database", "table", SLOT)
        misplaced = [
            f"{r['database']}.{r['table']}"
            for r in placed.distinct().collect()
            if r[SLOT] != slot_of(r["database"], r["table"], slots)
        ]
        if misplaced:
            raise InvalidConfigError(
                f"the catalog {self.path} is laid out for another slot count in this membership "
                f"topic's era ({len(misplaced)} table(s), {misplaced[0]} first), not for "
                f"cluster.slots = {slots}: a new slot count needs a new cluster.topic "
                "(the scale-out docs, 'Choosing the slots')"
            )
        alter = (
            f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ('{LAYOUT_PROPERTY}' = '{slots}')"
        )
        with_retries(
            f"catalog layout of {self.path}", partial(self.spark.sql, alter), table="catalog_layout"
        )
        self.layout = slots
        log.info("catalog %s laid out for %d slot(s)", self.path, slots)

    def _write(self, rows: Mapping[JobRef, CatalogRow]) -> None:
        """Replace the table's content with ``rows`` in one commit.

        The catalog is one row per job, kept whole in memory, and only this
        service writes it: writing it whole is one Spark job, where a MERGE
        first reads and joins the table (and rewrites the same file anyway).
        """
        self.settle()
        self._write_table(rows)
        self._durable = dict(rows)

    def _write_table(
        self, rows: Mapping[JobRef, CatalogRow], base: int | None = None
    ) -> int | None:
        """Overwrite the table with ``rows``, one write at a time; with ``base``, only if
        no write happened since the write count was ``base`` (None then: skipped)."""
        with self._write_lock:
            if base is not None and self._writes != base:
                return None
            if self.shared is not None:
                self._merge(rows.values(), ())
            else:
                state.overwrite(
                    self.spark,
                    self.path,
                    TABLE_SCHEMA,
                    [self._stored(r, self.layout) for r in rows.values()],
                    partitioned_by=(SLOT,),
                )
            self._writes += 1
            return self._writes

    def _writable(self, rows: Iterable[CatalogRow]) -> tuple[list[CatalogRow], set[JobRef]]:
        """Of ``rows``, those this instance writes now, and those it keeps for later."""
        if self.shared is None:
            return list(rows), set()
        write, defer = [], set()
        for row in rows:
            scope = self.shared.scope(row)
            if scope is RowScope.WRITE:
                write.append(row)
            elif scope is RowScope.DEFER:
                defer.add(row.row_id)
        return write, defer

    def _merge(self, rows: Iterable[CatalogRow], deleted: Iterable[CatalogRow]) -> None:
        """Upsert ``rows`` and delete ``deleted`` in one signed MERGE (a shared catalog)."""
        from delta.tables import DeltaTable
        from pyspark.sql.types import BooleanType

        assert self.shared is not None
        stamped = [
            (*self._stored(replace(r, owner=self.shared.owner(r)), self.layout), gone)
            for batch, gone in ((rows, False), (deleted, True))
            for r in batch
        ]
        if not stamped:
            return
        if not self._laid_out:
            raise AssertionError("a shared catalog is written before its layout is known")
        signed = self.shared.sign()
        session = self._session
        source_schema = StructType([*TABLE_SCHEMA.fields, StructField("_lp_gone", BooleanType())])
        columns: dict[str, str | Column] = {
            f"`{f.name}`": f"s.`{f.name}`" for f in TABLE_SCHEMA.fields
        }
        # the partitions of these rows' slots only: other instances' writes do not conflict
        slots = ", ".join(str(s) for s in sorted({row[-2] for row in stamped}))
        on = " AND ".join(
            [f"t.`{SLOT}` IN ({slots})", *(f"t.`{k}` = s.`{k}`" for k in (SLOT, *KEY_COLUMNS))]
        )

        def merge() -> None:
            source = session.createDataFrame(stamped, source_schema)
            with signed_session(session, signed):
                (
                    DeltaTable.forPath(session, self.path)
                    .alias("t")
                    .merge(source.alias("s"), on)
                    .whenMatchedDelete(condition=f"s._lp_gone AND {NOT_OLDER}")
                    .whenMatchedUpdate(condition=f"NOT s._lp_gone AND {NOT_OLDER}", set=columns)
                    .whenNotMatchedInsert(condition="NOT s._lp_gone", values=columns)
                    .execute()
                )

        with_retries(f"catalog write to {self.path}", merge, table="catalog")

    def era(self, identity: str) -> int:
        """The era of the membership topic ``identity`` (``cluster.enabled``), with the
        table laid out for :attr:`slots` before anything of this instance is written."""
        era = self._era(identity)
        if not self._laid_out:
            assert self.slots is not None
            found = self._found_layout()
            if found == self.slots:
                self.layout = found
            else:
                self._lay_out(self.slots, era)
            self._laid_out = True
        return era

    def _era(self, identity: str, attempts: int = 8) -> int:
        """The era of ``identity``: the one the catalog's properties hold for it, or one
        above theirs for a topic they do not name (recorded at once; of instances
        starting together, Delta lets one record it and the others read it)."""
        from delta.tables import DeltaTable

        for attempt in range(attempts):
            detail = DeltaTable.forPath(self.spark, self.path).detail().first()
            properties = {} if detail is None else dict(detail["properties"] or {})
            era = int(properties.get(ERA_PROPERTY, "0"))
            if properties.get(MEMBERSHIP_PROPERTY) == identity:
                return era
            try:
                self.spark.sql(
                    f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES "
                    f"('{ERA_PROPERTY}' = '{era + 1}', '{MEMBERSHIP_PROPERTY}' = '{identity}')"
                )
            except Exception as exc:
                if not conflicting(exc) or attempt == attempts - 1:
                    raise
                continue
            log.info(
                "membership topic %s starts era %d of catalog %s", identity, era + 1, self.path
            )
            return era + 1
        raise AssertionError("unreachable")

    def rows(self) -> list[CatalogRow]:
        return list(self._rows.values())

    def by_id(self) -> Mapping[JobRef, CatalogRow]:
        return self._rows

    def stage(self, rows: Mapping[JobRef, CatalogRow]) -> None:
        """Change rows in memory now; :meth:`commit_staged` writes them."""
        self._rows.update(rows)
        self._staged.update(rows)

    def commit_staged(self) -> int:
        """Write the staged rows, and with them every row changed only in memory."""
        staged = {rid: self._rows[rid] for rid in self._staged if rid in self._rows}
        self._staged.clear()
        if staged:
            unflushed = {rid: self._rows[rid] for rid in self._dirty if rid in self._rows}
            self.commit({**unflushed, **staged})
        return len(staged)

    def remember(self, rows: Iterable[CatalogRow], *, progress: bool = False) -> None:
        """Change rows in memory only; :meth:`flush` writes them later.

        ``progress``: the rows carry advanced watermarks or statuses, which the
        catalog table should show sooner than idle times (:attr:`behind`).
        """
        for row in rows:
            self._rows[row.row_id] = row
            self._dirty.add(row.row_id)
            if progress:
                self._progress.add(row.row_id)

    @property
    def behind(self) -> bool:
        """Whether memory holds advanced watermarks or statuses the table does not."""
        return bool(self._progress)

    def _unflushed(self) -> dict[JobRef, CatalogRow]:
        """Rows changed only in memory. A row also staged waits for
        :meth:`commit_staged`: the staged rows of a batch are one prefix of the
        change log, and writing some of them early would persist a later message
        without an earlier one (a replay then takes the earlier one as applied)."""
        return {
            rid: self._rows[rid]
            for rid in self._dirty
            if rid in self._rows and rid not in self._staged
        }

    def _await_flush(self) -> None:
        """Let a background flush end, and take in its result."""
        if self._flushing is not None and self._flushing.thread is not None:
            self._flushing.thread.join()
        self.settle()

    def flush(self) -> int:
        """Write the rows changed only in memory (after a background flush ends)."""
        self._await_flush()
        dirty = self._unflushed()
        self.commit(dirty)
        return len(dirty)

    def flush_in_background(self) -> int:
        """Start writing the rows changed only in memory on a thread of its own, so
        the micro-batch does not wait for a write of the whole table; the rows it
        writes (0: nothing to write, or a flush still runs).

        Its content is taken now. It writes only if no other write went first (a
        commit then took the rows along, as every write holds what memory does),
        and :meth:`settle` takes its result into memory on the micro-batch thread.
        A write that fails leaves the rows to the next flush: the watermarks are
        durable in the iteration history already.
        """
        self.settle()
        if self._flushing is not None:
            return 0
        rows = self._unflushed()
        if not rows:
            return 0
        if self.shared is not None:
            writable, deferred = self._writable(rows.values())
            flush = _Flush(self._writes, {r.row_id: r for r in writable}, rows, deferred=deferred)
        else:
            flush = _Flush(self._writes, {**self._durable, **rows}, rows)

        def write() -> None:
            try:
                flush.written_as = self._write_table(flush.content, flush.base)
            except BaseException as exc:  # settled on the micro-batch thread
                flush.error = exc

        flush.thread = threading.Thread(target=write, name="lakeprop-catalog-flush", daemon=True)
        self._flushing = flush
        flush.thread.start()
        return len(rows)

    def settle(self) -> None:
        """Take in a background flush that has ended: if its write is still the
        table's latest, memory learns that its rows are durable."""
        flush = self._flushing
        if flush is None or (flush.thread is not None and flush.thread.is_alive()):
            return
        self._flushing = None
        if flush.error is not None:
            log.warning("catalog flush failed, retried at the next one: %s", flush.error)
            return
        if flush.written_as is None or flush.written_as != self._writes:
            return  # a later write holds these rows, or rewrote the table without them
        if self.shared is not None:
            self._durable.update(flush.content)
        else:
            self._durable = flush.content
        done = {
            rid
            for rid, row in flush.rows.items()
            if self._rows.get(rid) is row and rid not in flush.deferred
        }
        self._dirty -= done
        self._progress -= done

    def dropped_before(self, cutoff: datetime) -> list[JobRef]:
        """Jobs whose drop is written and older than ``cutoff`` (a staged drop is not)."""
        return [
            r.row_id
            for r in self._rows.values()
            if r.drop_at is not None
            and r.drop_at < cutoff
            and r.row_id not in self._staged
            and (self.shared is None or self.shared.scope(r) is RowScope.WRITE)
        ]

    def delete(self, row_ids: Iterable[JobRef]) -> None:
        """Remove rows (garbage collection of dropped jobs)."""
        doomed = [self._rows[rid] for rid in row_ids if rid in self._rows]
        if not doomed:
            return
        self._await_flush()  # what the table holds, with the flush's rows if it wrote
        if self.shared is not None:
            with self._write_lock:
                self._merge((), doomed)
                self._writes += 1
            for row in doomed:
                self._durable.pop(row.row_id, None)
        else:
            remaining = dict(self._durable)
            for row in doomed:
                remaining.pop(row.row_id, None)
            self._write(remaining)
        for row in doomed:
            self._rows.pop(row.row_id, None)
            self._dirty.discard(row.row_id)
            self._progress.discard(row.row_id)
            self._staged.discard(row.row_id)

    def commit(self, upserts: Mapping[JobRef, CatalogRow]) -> None:
        """Write changed rows to Delta, then to memory (so a failed write changes neither).

        A shared catalog writes only the rows this instance serves; rows of tables
        assigned here but not writable this moment stay dirty for a later write.
        """
        if not upserts:
            return
        if self.shared is not None:
            write, deferred = self._writable(upserts.values())
            self.settle()
            self._write_table({r.row_id: r for r in write})
            self._durable.update({r.row_id: r for r in write})
            self._rows.update(upserts)
            done = set(upserts) - deferred
            self._dirty.difference_update(done)
            self._progress.difference_update(done)
            self._dirty.update(deferred)
            return
        self._write({**self._durable, **upserts})
        self._rows.update(upserts)
        self._dirty.difference_update(upserts)
        self._progress.difference_update(upserts)

    def durable_rows(self, wanted: Callable[[CatalogRow], bool]) -> list[CatalogRow]:
        """The rows ``wanted`` picks, as the table holds them now (another instance
        may have written them since :meth:`load`)."""
        rows = state.read_table(self.spark, self.path).collect()
        return [r for r in map(CatalogRow.from_spark, rows) if wanted(r)]

    def adopt(
        self,
        durable: Iterable[CatalogRow],
        ahead: Iterable[CatalogRow],
        gone: Iterable[JobRef],
    ) -> None:
        """Take over rows another instance wrote: ``durable`` as the table holds them,
        ``ahead`` (memory knows more of the change log) staged to be written,
        ``gone`` forgotten (collected by the other instance)."""
        for row in durable:
            rid = row.row_id
            self._rows[rid] = row
            self._durable[rid] = row
            self._dirty.discard(rid)
            self._progress.discard(rid)
        for rid in gone:
            self._rows.pop(rid, None)
            self._durable.pop(rid, None)
            for marks in (self._dirty, self._progress, self._staged):
                marks.discard(rid)
        self.stage({r.row_id: r for r in ahead})
