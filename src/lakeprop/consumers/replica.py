"""``replica``: a Delta copy of chosen columns of the source, keyed by primary key.

A snapshot overwrites the target; a tail applies the last change of each key in
the range with one MERGE (delete, update or insert), so the replica equals the
source's chosen columns at the watermark version. The MERGE reads only the
target files whose primary key statistics overlap the change set's keys
(``ConsumerContext.in_change_range``). Applying a range again, or an
overlapping one, leaves the same result.

Options::

    {"primary_key": ["id"],            # required, one or more source columns
     "columns": ["id", "name"],        # optional, defaults to all columns
     "target_database": "replicas",    # optional, defaults to the source database
     "target_table": "orders_copy"}    # optional, defaults to <table>_<job name>
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakeprop.changes import latest_change_per_key_arrow
from lakeprop.consumers import native
from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.consumers.options import (
    TARGET_OPTIONS,
    identifier_list,
    reject_unknown_options,
    target_options,
)
from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError
from lakeprop.identifiers import quote
from lakeprop.tables.resolve import TableHandle

if TYPE_CHECKING:
    import pyarrow as pa


class ReplicaConsumer(Consumer):
    """The source's chosen columns, one row per primary key, MERGEd per range."""

    native = True
    native_snapshot = True

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        reject_unknown_options("replica", options, {"primary_key", "columns", *TARGET_OPTIONS})
        try:
            primary_key = identifier_list(options.get("primary_key"), "replica", "primary_key")
            raw_columns = options.get("columns")
            columns = (
                None if raw_columns is None else identifier_list(raw_columns, "replica", "columns")
            )
            out: dict[str, Any] = {"primary_key": primary_key, "columns": columns}
            out.update(target_options(options))
        except InvalidIdentifierError as exc:
            raise InvalidConsumerOptionsError(str(exc)) from None
        if columns is not None:
            missing = [c for c in primary_key if c.lower() not in {x.lower() for x in columns}]
            if missing:
                raise InvalidConsumerOptionsError(
                    f"replica option columns must include the primary key column(s) {missing}"
                )
        return out

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return list(options["primary_key"]) + [
            c for c in (options.get("columns") or []) if c not in options["primary_key"]
        ]

    @classmethod
    def key_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return list(options["primary_key"])

    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        self.key: list[str] = list(context.options["primary_key"])
        self.columns: list[str] = self.target_columns()

    def target_columns(self) -> list[str]:
        """Columns of the target table, in order."""
        return list(self.context.options.get("columns") or self.context.source_columns)

    def written_columns(self) -> list[str]:
        return self.target_columns()

    def snapshot(self, rows: DataFrame, version: int) -> int:
        data = rows.select(*self.columns)
        self.overwrite(data, version)
        return int(data.count())

    def snapshot_native(self, rows: pa.Table, version: int) -> int:
        """The same overwrite with delta-rs, in the driver: the chosen columns, each
        nullable, the change feed of a new target on unless the job turned it off,
        one commit carrying the job's transaction, skipped when it is there already."""
        data = rows.select(self.columns)
        native.overwrite(
            self.target.location(),
            data,
            self.context.storage,
            self.context.txn_app_id,
            version,
            self.change_feed,
        )
        return int(data.num_rows)

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        target = self.require_target()
        # a range holding only an ALTER TABLE ... ADD COLUMNS widens the target too
        self._follow_added_columns(target, changes, from_version)
        rows = self.context.change_rows
        if rows == 0 or (rows is None and changes.isEmpty()):
            return 0
        latest = self.context.latest_changes(changes, self.key).select(
            *self.columns, "_change_type"
        )
        matched = [F.col(f"t.{k}") == F.col(f"s.{k}") for k in self.key]
        on = reduce(lambda a, b: a & b, matched + self.context.in_change_range(self.key, "t"))
        values: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in self.columns}
        deleted = F.col("s._change_type") == "delete"
        merge = (
            target.delta()
            .alias("t")
            .merge(latest.alias("s"), on)
            .whenMatchedDelete(condition=deleted)
            .whenMatchedUpdate(set=values)
            .whenNotMatchedInsert(condition=~deleted, values=values)
        )
        with self.context.idempotent(to_version), self.context.merging_changes():
            metrics = merge.execute().first()
        # rows the MERGE inserted, updated or deleted (0 when Delta skipped a replay)
        return 0 if metrics is None else int(metrics["num_affected_rows"])

    def _follow_added_columns(self, target: TableHandle, changes: DataFrame, start: int) -> None:
        """Columns the source gained after ``start`` are added to the target (its rows
        hold NULL there, as the source's older rows do). A column the target lacks
        that the source had at ``start`` was dropped from the target underneath the
        job: it is left for the MERGE to fail on, naming it."""
        present = {f.name.lower() for f in target.load(target.reader()).schema.fields}
        missing = [c for c in self.columns if c.lower() not in present]
        if not missing:
            return
        key = self.context.key
        source = self.context.locate(key.database, key.table)
        before = source.load(source.reader().option("versionAsOf", start)).schema
        had = {f.name.lower() for f in before.fields}
        fields = {f.name.lower(): f for f in changes.schema.fields}
        added = [fields[c.lower()] for c in missing if c.lower() not in had]
        if added:
            columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in added)
            self.context.spark.sql(f"ALTER TABLE {target.sql_name} ADD COLUMNS ({columns})")

    def apply_changes_native(self, changes: pa.Table, from_version: int, to_version: int) -> int:
        """The same MERGE with delta-rs, in the driver: the last change per key, one
        commit carrying the job's transaction, skipped when it is there already."""
        if changes.num_rows == 0:
            return 0
        target = self.require_target()
        table = native.open_table(target.location(), self.context.storage)
        if native.applied(table, self.context.txn_app_id, to_version):
            return 0  # written before a crash: the watermark catches up
        latest = latest_change_per_key_arrow(changes, self.key)
        return native.merge_changes(
            table, latest, self.key, self.columns, self.context.txn_app_id, to_version
        )
