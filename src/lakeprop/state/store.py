"""The service's own Delta tables: where they live and how they are written.

All state is plain Delta tables under ``state.location`` so that a notebook can
open them by path. Every write is one Delta commit and idempotent: the catalog
is written whole (:func:`overwrite`), verdicts are appended when their messages
are new and otherwise inserted only where their key is missing
(:func:`insert_new`), so writing the same rows twice changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from typing import Any

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakeprop.tables.probe import DeltaLogProbe

CATALOG_TABLE = "catalog"
REQUESTS_TABLE = "requests"
REJECTS_TABLE = "rejects"
HISTORY_TABLE = "iterations"
USAGE_TABLE = "usage"
ACCOUNTS_TABLE = "accounts"
BULK_OPERATIONS_TABLE = "bulk_operations"
BULK_TASKS_TABLE = "bulk_tasks"
EVENTS_TABLE = "events"


APPEND_LOG_PROPERTIES = {"delta.checkpointInterval": "100"}
"""For tables appended to on most ticks (the iteration history, the verdicts): a
checkpoint every 100 commits, not Delta's 10. Writing one is a Spark job over
the whole table state, and it made every tenth append 3 to 8 times slower than
the others; a read replays at most 99 small JSON commits instead."""


CREATE_WAIT = 30.0
"""Seconds a start waits for a state table another instance is creating."""

Rows = Sequence[Sequence[Any]]
"""Rows in a table's column order."""
Keys = Sequence[str]
"""The columns that identify a row."""


def ensure_table(
    spark: SparkSession,
    path: str,
    schema: StructType,
    properties: Mapping[str, str] | None = None,
    partitioned_by: Sequence[str] = (),
) -> bool:
    """Create the Delta table at ``path`` with ``schema`` (table ``properties``,
    partition columns ``partitioned_by``) unless it exists.

    True when it was created now: it is empty, so nothing need read it. An
    existing table is found from a listing of its log (no Spark job).
    """
    if DeltaLogProbe(spark).latest_version(path) is not None:
        return False
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if partitioned_by:
        builder = builder.partitionedBy(*partitioned_by)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    try:
        builder.execute()
    except Exception:
        # another instance sharing the state (cluster.enabled) is creating it: its
        # first commit shows up in a moment
        deadline = time.monotonic() + CREATE_WAIT
        while time.monotonic() < deadline:
            if DeltaLogProbe(spark).latest_version(path) is not None:
                return False
            time.sleep(0.2)
        raise
    return True


def untouched(spark: SparkSession, path: str) -> bool:
    """Whether the table :func:`ensure_table` created is still at its creation
    (version 0): written by no one since, this process or another instance sharing
    the state, so empty. A listing of its log, no Spark job."""
    return DeltaLogProbe(spark).latest_version(path) == 0


def read_table(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("delta").load(path)


def _key_condition(keys: Sequence[str]) -> Column:
    return reduce(lambda a, b: a & b, [F.col(f"t.{k}") == F.col(f"s.{k}") for k in keys])


def _merge(
    spark: SparkSession,
    path: str,
    schema: StructType,
    rows: Rows,
    keys: Keys,
    clauses: Callable[[DeltaMergeBuilder], DeltaMergeBuilder],
) -> None:
    if not rows:
        return
    source = spark.createDataFrame(list(rows), schema)
    builder = (
        DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), _key_condition(keys))
    )
    clauses(builder).execute()


def append(
    spark: SparkSession,
    path: str,
    schema: StructType,
    rows: Sequence[Sequence[Any]],
    options: Mapping[str, str] | None = None,
) -> None:
    """Append rows (one Delta commit, no read of the table): for rows known to be new.
    ``options`` go to the writer (an application transaction id, say)."""
    if rows:
        writer = spark.createDataFrame(list(rows), schema).write.format("delta")
        writer.options(**(options or {})).mode("append").save(path)


def overwrite(
    spark: SparkSession,
    path: str,
    schema: StructType,
    rows: Sequence[Sequence[Any]],
    partitioned_by: Sequence[str] = (),
) -> None:
    """Replace the table's content with ``rows`` (one Delta commit, no read of the table)."""
    writer = spark.createDataFrame(list(rows), schema).coalesce(1).write.format("delta")
    if partitioned_by:
        writer = writer.partitionBy(*partitioned_by)
    writer.mode("overwrite").save(path)


def insert_new(spark: SparkSession, path: str, schema: StructType, rows: Rows, keys: Keys) -> None:
    """Insert rows whose key is not in the table yet; existing rows stay as they are."""
    _merge(spark, path, schema, rows, keys, lambda m: m.whenNotMatchedInsertAll())


def upsert(spark: SparkSession, path: str, schema: StructType, rows: Rows, keys: Keys) -> None:
    """Insert rows, replacing those with the same key (one MERGE; none without rows).
    A table of an earlier release gains the columns ``schema`` adds."""
    _merge(
        spark,
        path,
        schema,
        rows,
        keys,
        lambda m: m.whenMatchedUpdateAll().whenNotMatchedInsertAll().withSchemaEvolution(),
    )
