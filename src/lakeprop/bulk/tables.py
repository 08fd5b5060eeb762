"""The Delta tables of bulk operations: ``bulk_operations`` and ``bulk_tasks``.

One row per bulk request and one per task (a matched job), keyed by bulk id
and by bulk id and task number. Rows change state as the tasks run; each write
is one MERGE per table of the rows that changed, so writing the same rows
again changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakeprop.bulk.model import BulkOperation, BulkTask
from lakeprop.state import store as state
from lakeprop.state.schema import spark_schema
from lakeprop.tables.probe import DeltaLogProbe

BULK_OPERATIONS_SCHEMA = spark_schema(BulkOperation)
BULK_TASKS_SCHEMA = spark_schema(BulkTask)


class BulkTables:
    """Reader and writer of the two tables (the executor's store)."""

    def __init__(self, spark: SparkSession, operations_path: str, tasks_path: str) -> None:
        self.spark = spark
        self.operations_path = operations_path
        self.tasks_path = tasks_path
        self._empty = False
        self._created = True

    def ensure(self) -> None:
        """Learn from the operations table's log (no Spark job) whether the tables
        exist and hold anything. They are created with the first bulk request:
        most services never run one, and then nothing creates or reads them."""
        version = DeltaLogProbe(self.spark).latest_version(self.operations_path)
        self._created = version is not None
        self._empty = version in (None, 0)

    def operations(self, bulk_id: str | None = None) -> list[BulkOperation]:
        """Every operation, or the one with ``bulk_id``."""
        if self._empty:
            return []
        df = state.read_table(self.spark, self.operations_path)
        if bulk_id is not None:
            df = df.where(F.col("bulk_id") == bulk_id)
        return [BulkOperation.from_row(r) for r in df.collect()]

    def tasks(self, bulk_ids: Iterable[str]) -> list[BulkTask]:
        ids = sorted(set(bulk_ids))
        if not ids or self._empty:
            return []
        rows = (
            state.read_table(self.spark, self.tasks_path)
            .where(F.col("bulk_id").isin(ids))
            .collect()
        )
        return sorted(map(BulkTask.from_row, rows), key=lambda t: (t.bulk_id, t.task_no))

    def write(self, operations: Sequence[BulkOperation], tasks: Sequence[BulkTask]) -> None:
        """Upsert changed rows: tasks first, so an operation row never names tasks
        the table lacks (the tables are created first, tasks first, if need be)."""
        if not self._created:
            state.ensure_table(self.spark, self.tasks_path, BULK_TASKS_SCHEMA)
            state.ensure_table(self.spark, self.operations_path, BULK_OPERATIONS_SCHEMA)
            self._created = True
        state.upsert(
            self.spark,
            self.tasks_path,
            BULK_TASKS_SCHEMA,
            [t.as_tuple() for t in tasks],
            ("bulk_id", "task_no"),
        )
        state.upsert(
            self.spark,
            self.operations_path,
            BULK_OPERATIONS_SCHEMA,
            [o.as_tuple() for o in operations],
            ("bulk_id",),
        )
        self._empty = False
