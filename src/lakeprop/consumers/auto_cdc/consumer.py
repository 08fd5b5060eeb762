"""The ``auto_cdc`` consumer: prepared events applied as SCD type 1 or 2, the
tables kept next to the target, and the target's schema following the source's."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from lakeprop.consumers import native
from lakeprop.consumers.auto_cdc import events as ev
from lakeprop.consumers.auto_cdc import expressions, options, schema
from lakeprop.consumers.auto_cdc.options import (
    COLUMN_SEQUENCES,
    END_AT,
    SEQUENCE,
    START_AT,
    CdcOptions,
)
from lakeprop.consumers.auto_cdc.scd1 import Scd1, conflict_error
from lakeprop.consumers.auto_cdc.scd2 import Scd2
from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.faults import fault_point
from lakeprop.spec import target_table
from lakeprop.tables.resolve import CHANGE_FEED_PROPERTY, TableHandle

TOMBSTONES, EVENTS, QUARANTINE = "__tombstones", "__events", "__quarantine"
"""Suffixes of the tables next to the target."""
_EXPIRY_LOOKED: dict[str, float] = {}
"""When this process last looked for expired tombstones, per job configuration."""
DRIVER_READ_PAUSE = 600.0
"""Seconds a table whose log delta-rs failed to read is left to Spark alone."""
_DRIVER_READ_FAILED: dict[str, float] = {}
"""When delta-rs last failed to read a table's log, per location."""

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger("lakeprop.consumers.auto_cdc")


def sql_ref(table: TableHandle) -> str:
    """The table as Spark SQL names it."""
    return table.sql_name


class AutoCdcConsumer(Consumer):
    """Change events to an SCD type 1 or 2 Delta table (see the module docstring)."""

    @classmethod
    def validate_options(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        return options.validate(raw)

    @classmethod
    def source_columns(cls, validated: Mapping[str, Any]) -> list[str]:
        return options.source_columns(validated)

    @classmethod
    def check_source(
        cls, validated: Mapping[str, Any], source: StructType, spark: SparkSession
    ) -> None:
        expressions.check_source(CdcOptions.of(validated), source, spark)

    @classmethod
    def key_columns(cls, validated: Mapping[str, Any]) -> list[str]:
        return list(validated["keys"])

    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        self.options = CdcOptions.of(context.options)
        database, table = target_table(context.key, context.options)
        self._names = (database, table)
        self.source_name = f"{context.key.database}.{context.key.table}"

    def beside(self, suffix: str) -> TableHandle:
        """A table next to the target: its tombstones, event store or quarantine."""
        database, table = self._names
        return self.context.locate(database, f"{table}{suffix}")

    # -- the contract ---------------------------------------------------------------

    def snapshot(self, rows: DataFrame, version: int) -> int:
        columns = self.options.target_columns(rows.columns)
        if self.options.table_source:
            raw = ev.table_snapshot(rows, self.options, columns, self._commit(version))
        else:
            raw = ev.raw_events(rows, self.options, columns)
        prepared = ev.prepare(raw, self.options, self.source_name, -1, version)
        self._quarantine(prepared, version)
        key_fields = [rows.schema[k] for k in self.options.keys]
        if self.options.scd_type == 1:
            return self._snapshot_scd1(prepared, columns, key_fields, version)
        return self._snapshot_scd2(prepared, columns, version)

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        target = self.require_target()
        columns = self.options.target_columns(changes.columns)
        rows = self.context.change_rows
        if rows == 0 or (rows is None and changes.isEmpty()):
            # a range holding only an ALTER TABLE ... ADD COLUMNS widens the target too
            self._follow_added_columns(target, changes, columns)
            return 0
        raw = self._raw_events(changes, columns)
        prepared = ev.prepare(raw, self.options, self.source_name, from_version, to_version)
        self._quarantine(prepared, to_version)
        self._evolve(target, prepared.frame, columns)
        if self.options.scd_type == 1:
            return self._apply_scd1(target, prepared, columns, to_version)
        return self._apply_scd2(target, prepared, columns, to_version)

    def _raw_events(self, changes: DataFrame, columns: list[str]) -> DataFrame:
        """The range's change rows as events (lazily: no Spark job)."""
        if self.options.table_source:
            return ev.table_changes(changes, self.options, columns)
        if self.options.skip_change_commits:
            changes = ev.without_change_commits(changes)
        return ev.raw_events(changes, self.options, columns)

    def _follow_added_columns(
        self, target: TableHandle, changes: DataFrame, columns: list[str]
    ) -> None:
        """On a range without change rows, columns the source gained are added to the
        target (and its event store) from the events' schema alone, with no Spark job."""
        present = {f.name.lower() for f in target.load(target.reader()).schema.fields}
        if all(c.lower() in present for c in columns):
            return
        self._evolve(target, self._raw_events(changes, columns), columns)

    # -- SCD type 1 --------------------------------------------------------------------

    def _scd1(self, columns: list[str], prepared: ev.Events) -> Scd1:
        return Scd1(self.options, self.options.keys, columns, prepared.seq_type)

    def _snapshot_scd1(
        self, prepared: ev.Events, columns: list[str], key_fields: list[StructField], version: int
    ) -> int:
        scd = self._scd1(columns, prepared)
        resets = scd.resets(prepared, None)
        data = scd.new_rows(scd.source(prepared, resets))
        self._create(self.target, data, version)
        tombstones = scd.tombstones(scd.source(prepared, resets), resets, self.context.spark)
        typed = tombstones.select(
            *[F.col(f.name).cast(f.dataType) for f in scd.tombstone_schema(key_fields).fields]
        )
        self._create(self.beside(TOMBSTONES), typed, version)
        return int(data.count())

    def _apply_scd1(
        self, target: TableHandle, prepared: ev.Events, columns: list[str], version: int
    ) -> int:
        scd = self._scd1(columns, prepared)
        tombstones = self.beside(TOMBSTONES)
        held = None if self._none_held(tombstones) else tombstones.load(tombstones.reader())
        resets = scd.resets(prepared, held)
        bounds = [] if resets.new_truncate else self.context.in_change_range(self.options.keys, "t")
        # held: the MERGE reads it twice, and it joins the tombstones (a Delta table)
        source = scd.source(prepared, resets).localCheckpoint()
        merge = scd.merge(target.delta(), source, resets, bounds)
        with self.context.idempotent(version), self.context.merging_held():
            try:
                metrics = merge.execute().first()
            except Exception as exc:
                error = conflict_error(exc, self.source_name)
                if error is None:
                    raise
                raise error from None
        if prepared.deletes or resets.new_truncate:  # else there is nothing to remember
            added = scd.tombstones(source, resets, self.context.spark)
            writer = (
                added.write.format("delta")
                .mode("append")
                .options(**self.context.writer_options(version))
            )
            tombstones.save(writer)
            if held is not None:
                self._expire(scd, tombstones, held)
        return 0 if metrics is None else int(metrics["num_affected_rows"])

    def _none_held(self, tombstones: TableHandle) -> bool:
        """Whether the tombstone table holds no file at all, read from its log in the
        driver: the range is then decided as against an empty table without reading
        it (five Spark jobs of a tail with no delete ever: the table's file
        filtering, and the joins' broadcasts). Only this job's iterations write the
        table, and never two at once."""
        table = self._in_driver(tombstones)
        try:
            return table is not None and not table.file_uris()
        except Exception as exc:  # delta-rs cannot list it: Spark reads it
            log.debug("delta-rs could not list %s (Spark reads it): %s", tombstones.path, exc)
            _DRIVER_READ_FAILED[str(tombstones.path)] = time.monotonic()
            return False

    def _in_driver(self, handle: TableHandle) -> DeltaTable | None:
        """``handle`` opened with delta-rs to read its log in the driver, where the
        engine allows it; else None. A table named through a catalog (whose location
        takes Spark jobs to learn), a protocol delta-rs does not read as Spark does,
        or a failure to read it leaves the read to Spark; a location that failed is
        not tried again for :data:`DRIVER_READ_PAUSE` seconds."""
        location = handle.path
        if location is None or not (self.context.driver_reads and native.available()):
            return None
        if time.monotonic() < _DRIVER_READ_FAILED.get(location, -math.inf) + DRIVER_READ_PAUSE:
            return None
        try:
            table = native.open_table(location, self.context.storage)
            return table if native.readable(table) is None else None
        except Exception as exc:  # delta-rs cannot read it: Spark reads it
            log.debug("delta-rs could not read %s (Spark reads it): %s", location, exc)
            _DRIVER_READ_FAILED[location] = time.monotonic()
            return None

    def _expire(self, scd: Scd1, tombstones: TableHandle, held: DataFrame) -> None:
        """Drop the tombstones past their retention, looked for at most once per
        tenth of the retention (an hour at most) per job and process: each look
        is a Spark job, and a tombstone kept a little longer harms nothing."""
        retention = self.options.tombstone_retention
        app_id, now = self.context.txn_app_id, time.monotonic()
        if now - _EXPIRY_LOOKED.get(app_id, -math.inf) < min(retention / 10, 3600.0):
            return
        _EXPIRY_LOOKED[app_id] = now
        expired = scd.expired(held, retention)
        if held.where(expired).limit(1).count():
            tombstones.delta().delete(expired)

    # -- SCD type 2 --------------------------------------------------------------------

    def _scd2(self, columns: list[str]) -> Scd2:
        return Scd2(self.options, self.options.keys, columns, self.options.tracked(columns))

    def _snapshot_scd2(self, prepared: ev.Events, columns: list[str], version: int) -> int:
        scd = self._scd2(columns)
        self._create(self.beside(EVENTS), scd.stored(prepared.frame), version)
        versions = scd.fold(prepared.frame)
        self._create(self.target, versions, version)
        return int(versions.count())

    def _apply_scd2(
        self, target: TableHandle, prepared: ev.Events, columns: list[str], version: int
    ) -> int:
        scd = self._scd2(columns)
        store = self.beside(EVENTS)
        keys = list(self.options.keys)
        # the touched keys' events and rows, read from the files whose key statistics
        # overlap the range's keys (data skipping), not the whole store
        within = reduce(lambda a, b: a & b, self.context.in_change_range(keys), F.lit(True))
        touched = prepared.frame.select(*keys).distinct()
        stored = store.load(store.reader()).where(within).join(touched, keys)
        current = target.load(target.reader()).where(within).join(touched, keys)
        in_order = self._in_order(scd, prepared, stored, target, store)
        if in_order is not None:
            new = in_order
            changes = scd.in_order(in_order, current).localCheckpoint()
        else:
            new = scd.new_events(prepared.frame, stored, self.source_name).localCheckpoint()
            if new.isEmpty():
                return 0  # every event applied already (a replayed range)
            every = scd.as_events(stored).unionByName(new)
            changes = scd.changes(scd.fold(every), current).localCheckpoint()
        bounds = self.context.in_change_range(keys, "t")
        with self.context.idempotent(version), self.context.merging_held():
            metrics = scd.merge(target.delta(), changes, bounds).execute().first()
        fault_point("auto_cdc.between_writes")
        writer = (
            scd.stored(new)
            .write.format("delta")
            .mode("append")
            .options(**self.context.writer_options(version))
        )
        store.save(writer)
        return 0 if metrics is None else int(metrics["num_affected_rows"])

    def _in_order(
        self,
        scd: Scd2,
        prepared: ev.Events,
        stored: DataFrame,
        target: TableHandle,
        store: TableHandle,
    ) -> DataFrame | None:
        """The range's events, held, when the target's changes can be had from each
        key's latest stored sequence alone, without folding its stored events;
        else None.

        They can when every event of the range is later than every stored event
        of its key (:meth:`Scd2.in_order`: each key's history goes on from its
        open version) and the target is in step with the store: the job's last
        write to the target (its Delta transaction version, read from the log in
        the driver) is no later than its last append to the store, so no range
        wrote the one and crashed before the other. Whether any event is late is
        observed as the events are held (:meth:`Scd2.lateness`): only a figure of
        0 takes this way (no figure, or none for a range without events, does
        not)."""
        if not self._in_step(target, store):
            return None
        late = Observation("auto_cdc late events")
        events = scd.lateness(prepared.frame, stored, late).localCheckpoint()
        return events if late.get.get("late") == 0 else None

    def _in_step(self, target: TableHandle, store: TableHandle) -> bool:
        """Whether the job's last transaction in the target is no later than its last
        in the event store, both read from their logs in the driver (False where the
        engine does not read logs there, or either has none)."""
        written, held = self._in_driver(target), self._in_driver(store)
        if written is None or held is None:
            return False
        app_id = self.context.txn_app_id
        try:
            wrote, appended = written.transaction_version(app_id), held.transaction_version(app_id)
        except Exception as exc:  # delta-rs cannot read them: the full fold decides
            log.debug("delta-rs could not read the transactions of %s: %s", target.path, exc)
            _DRIVER_READ_FAILED[str(target.path)] = time.monotonic()
            return False
        return wrote is not None and appended is not None and wrote <= appended

    # -- chores ----------------------------------------------------------------------

    def _commit(self, version: int) -> dict[str, Any]:
        """The snapshot's commit as a table source's sequence sees it: its version, and
        its timestamp when the sequence has it (from the source's history)."""
        commit: dict[str, Any] = {options.COMMIT_VERSION: version}
        if options.COMMIT_TIMESTAMP in self.options.sequence_by:
            source = self.context.locate(self.context.key.database, self.context.key.table)
            found = source.delta().history().where(F.col("version") == version).first()
            commit[options.COMMIT_TIMESTAMP] = None if found is None else found["timestamp"]
        return commit

    def _create(self, table: TableHandle, data: DataFrame, version: int) -> None:
        """Replace ``table`` with ``data`` once per version, its change feed on (the
        target's unless the job's ``change_feed`` option turned it off)."""
        feed = self.change_feed or table is not self.target
        writer = (
            data.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option(CHANGE_FEED_PROPERTY, str(feed).lower())
            .options(**self.context.writer_options(version))
        )
        table.save(writer)

    def _quarantine(self, prepared: ev.Events, version: int) -> None:
        """Rows with a NULL key or sequence, with the reason and their source version,
        set aside for the engine to write (the quarantine contract:
        :meth:`ConsumerContext.quarantine`)."""
        if prepared.quarantined is None:
            return
        rows = prepared.quarantined.drop(ev.OP)
        if ev.VERSION not in rows.columns:  # a snapshot's rows
            rows = rows.withColumn(ev.VERSION, F.lit(version))
        self.context.quarantine(rows.withColumn(ev.VERSION, F.col(ev.VERSION).cast("long")))

    def _evolve(self, target: TableHandle, events: DataFrame, columns: list[str]) -> None:
        """The target (and the event store) follow the source's columns, and the
        sequence's type where Delta widened it: the target's ``__SEQUENCE`` or
        ``__START_AT`` / ``__END_AT``, the tombstones', the event store's."""
        spark = self.context.spark
        seq_type = events.schema[ev.SEQ].dataType
        sequenced = (
            [(target, [SEQUENCE]), (self.beside(TOMBSTONES), [SEQUENCE])]
            if self.options.scd_type == 1
            else [(target, [START_AT, END_AT]), (self.beside(EVENTS), [SEQUENCE])]
        )
        for table, names in sequenced:
            if table.exists():
                now = table.load(table.reader()).schema
                schema.widen_sequence(spark, sql_ref(table), now, names, seq_type)
        wanted = StructType([events.schema[c] for c in (*self.options.keys, *columns)])
        have = target.load(target.reader()).schema
        mirrored = [COLUMN_SEQUENCES] if self.options.ignore_null_updates else []
        kept = StructType(
            [f for f in have.fields if f.name not in (SEQUENCE, COLUMN_SEQUENCES, START_AT, END_AT)]
        )
        schema.evolve(spark, sql_ref(target), kept, wanted, mirrored)
        if self.options.scd_type == 2:
            store = self.beside(EVENTS)
            held = store.load(store.reader()).schema
            kept = StructType([f for f in held.fields if not f.name.startswith("__")])
            schema.evolve(spark, sql_ref(store), kept, wanted, what="event store")
