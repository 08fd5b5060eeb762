"""A user-defined consumer, named in job specs by its import path:

    "consumer": {"type": "tests.integration.custom_consumers:AuditConsumer",
                 "options": {"primary_key": ["id"]}}

It keeps every change of the source in an audit Delta table: the initial
snapshot (``_change_type = 'snapshot'``), then each insert, update and delete
with its commit version. The docs show it as the example to copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakeprop.consumers import InvalidConsumerOptionsError
from lakeprop.consumers.base import Consumer
from lakeprop.identifiers import validate_identifier


class AuditConsumer(Consumer):
    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        key = options.get("primary_key")
        if not isinstance(key, list) or not key:
            raise InvalidConsumerOptionsError("audit option primary_key must list columns")
        table = options.get("target_table")
        return {
            "primary_key": [validate_identifier(c, "audit primary_key") for c in key],
            "target_table": None if table is None else validate_identifier(table, "target"),
        }

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return list(options["primary_key"])

    def _target(self):  # type: ignore[no-untyped-def]
        key, options = self.context.key, self.context.options
        return self.context.locate(key.database, options["target_table"] or f"{key.table}_audit")

    def snapshot(self, rows: DataFrame, version: int) -> int:
        data = rows.withColumn("_change_type", F.lit("snapshot")).withColumn(
            "_commit_version", F.lit(version).cast("long")
        )
        writer = (
            data.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .options(**self.context.writer_options(version))
        )
        self._target().save(writer)
        return int(data.count())

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        data = changes.where("_change_type != 'update_preimage'").drop("_commit_timestamp")
        # Keyed by (key, version, change type): an overlapping range adds nothing twice.
        keys = [*self.context.options["primary_key"], "_commit_version", "_change_type"]
        on = reduce(lambda a, b: a & b, [F.col(f"t.{k}") == F.col(f"s.{k}") for k in keys])
        with self.context.idempotent(to_version):
            (
                self._target()
                .delta()
                .alias("t")
                .merge(data.alias("s"), on)
                .whenNotMatchedInsertAll()
                .execute()
            )
        return int(data.count())
