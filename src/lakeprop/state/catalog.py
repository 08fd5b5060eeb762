"""The job catalog: one Delta row per job, modelled on ``mo_iscp_log``.

Columns follow MatrixOne's ``mo_iscp_log`` (account id, table identity, job
name, job id, job spec, job state, watermark, job status, create and drop time)
plus the Kafka coordinates of the last change log message applied to the row,
which is what makes applying the log idempotent: a message at or below those
coordinates has already been applied and is skipped (:mod:`lakeprop.state.apply`).

:class:`CatalogRow` is one row; :class:`JobCatalog` keeps the rows in memory
and decides when changes are written to the table
(:class:`~lakeprop.state.catalog_table.CatalogTable`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import SparkSession

from lakeprop.spec import JobRef
from lakeprop.state.catalog_table import (
    CatalogTable,
    RowScope,
    SharedWrites,
    WriteKind,
    write_kind,
)
from lakeprop.state.job_row import CatalogRow, one_row_per_job

log = logging.getLogger(__name__)


@dataclass
class _Flush:
    """A flush writing on a thread of its own (see :meth:`JobCatalog.flush_in_background`)."""

    base: int
    """The catalog's write count when its content was taken."""
    content: dict[JobRef, CatalogRow]
    """The rows it writes (a shared catalog: those this instance writes now)."""
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
    (:meth:`remember` with ``progress``). A commit takes along whatever memory
    holds; one instance writes only the rows that differ from the table's
    (:func:`~lakeprop.state.catalog_table.write_kind` says how).
    """

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        shared: SharedWrites | None = None,
        slots: int | None = None,
        merge_from: int = 20_000,
    ) -> None:
        self.spark = spark
        self.path = path
        self.shared = shared
        """Set when several instances share the table: each MERGEs its own rows."""
        self.table = CatalogTable(spark, path, shared, slots)
        self.merge_from = merge_from
        """One instance MERGEs a change of rows the table holds from this many rows
        (``state.catalog_merge_from``)."""
        self._rows: dict[JobRef, CatalogRow] = {}
        self._durable: dict[JobRef, CatalogRow] = {}
        """The rows as the Delta table holds them (one instance: changed by the thread
        that writes the table, under the write lock)."""
        self._dirty: set[JobRef] = set()
        self._progress: set[JobRef] = set()
        """Dirty rows whose watermark or status advanced (flushed more often)."""
        self._staged: set[JobRef] = set()
        self._created = False
        self._write_lock = threading.RLock()
        self._writes = 0
        """Writes of the table so far (under the lock)."""
        self._flushing: _Flush | None = None
        self._rewrite = False
        """The table held a job twice at load: one instance's next write is whole."""

    def ensure(self) -> None:
        self._created = self.table.ensure()

    def load(self) -> None:
        """Read every row from Delta (at start-up; afterwards memory is kept in step).

        One instance keeps the table's layout, and lays a table of an earlier release
        (not partitioned) out for one slot; a shared catalog is laid out in :meth:`era`.
        """
        rows, doubled = one_row_per_job([] if self._created else self.table.read())
        if doubled:
            log.warning(
                "catalog %s holds %d row(s) twice; the latest of each is kept, and the "
                "next write rewrites the table",
                self.path,
                doubled,
            )
            self._rewrite = True
        self._rows = {r.row_id: r for r in rows}
        self._durable = dict(self._rows)
        if not self._created and self.shared is None:
            self.table.keep_layout()

    def _write(self, upserts: Mapping[JobRef, CatalogRow], deleted: Iterable[JobRef] = ()) -> None:
        """One instance: write ``upserts`` and remove ``deleted`` in one commit."""
        self.settle()
        self._write_table(upserts, deleted)

    def _write_table(
        self,
        upserts: Mapping[JobRef, CatalogRow],
        deleted: Iterable[JobRef] = (),
        base: int | None = None,
    ) -> int | None:
        """Write ``upserts`` and remove ``deleted``, one write at a time; with ``base``,
        only if no write happened since the write count was ``base`` (None then:
        skipped). A shared catalog MERGEs ``upserts``; one instance writes what
        differs from the table's rows, and memory learns what the table holds."""
        with self._write_lock:
            if base is not None and self._writes != base:
                return None
            if self.shared is not None:
                self.table.merge(upserts.values(), ())
            else:
                self._durable = self._write_own(upserts, list(deleted))
            self._writes += 1
            return self._writes

    def _write_own(
        self, upserts: Mapping[JobRef, CatalogRow], deleted: list[JobRef]
    ) -> dict[JobRef, CatalogRow]:
        """One instance's write, of the kind :func:`write_kind` picks for the rows that
        differ from the table's; the rows the table then holds."""
        held = self._durable
        changed = {rid: row for rid, row in upserts.items() if held.get(rid) != row}
        gone = [held[rid] for rid in deleted if rid in held]
        content = {**held, **changed}
        for row in gone:
            del content[row.row_id]
        if not changed and not gone:
            return content
        replaced = sum(1 for rid in changed if rid in held) + len(gone)
        kind = (
            WriteKind.OVERWRITE
            if self._rewrite
            else write_kind(len(held), replaced, self.merge_from)
        )
        if kind is WriteKind.APPEND:
            self.table.append(changed.values())
        elif kind is WriteKind.MERGE:
            self.table.merge(changed.values(), gone)
        else:
            self.table.overwrite(content.values())
            self._rewrite = False
        return content

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

    def era(self, identity: str) -> int:
        """The era of the membership topic ``identity`` (``cluster.enabled``), with the
        table laid out for ``slots`` before anything of this instance is written."""
        return self.table.era(identity)

    @property
    def layout(self) -> int:
        """The slot count the table is laid out for."""
        return self.table.layout

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
            flush = _Flush(self._writes, rows, rows)

        def write() -> None:
            try:
                flush.written_as = self._write_table(flush.content, base=flush.base)
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
                self.table.merge((), doomed)
                self._writes += 1
            for row in doomed:
                self._durable.pop(row.row_id, None)
        else:
            self._write({}, [row.row_id for row in doomed])
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
        self._write(upserts)
        self._rows.update(upserts)
        self._dirty.difference_update(upserts)
        self._progress.difference_update(upserts)

    def durable_rows(self, wanted: Callable[[CatalogRow], bool]) -> list[CatalogRow]:
        """The rows ``wanted`` picks, as the table holds them now (another instance
        may have written them since :meth:`load`)."""
        rows, _ = one_row_per_job(self.table.read())
        return [r for r in rows if wanted(r)]

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
