"""Source tables: from a job's (database, table) to a Delta table and its identity.

A job names its source by database and table. With ``tables.resolution =
"path"`` that is the directory ``<warehouse>/<database>/<table>``; with
``"metastore"`` it is the session catalog's table (Hive metastore or Unity
Catalog). The Delta table id is the table's identity (the seed's table_id): a
table replaced under the same name gets a new id, and its jobs must be
re-registered.
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from lakeprop.config import TablesConfig
from lakeprop.consumers import get_consumer_type
from lakeprop.errors import ErrorCode, SourceTableError, TemporaryError
from lakeprop.identifiers import qualified
from lakeprop.spec import JobKey, JobSpec


@dataclass(frozen=True)
class SourceInfo:
    """What the service needs to know of a source table."""

    name: str
    table_id: str
    columns: tuple[str, ...]


class SourceTables:
    """Resolves and describes source tables; one lookup per table per micro-batch."""

    def __init__(self, spark: SparkSession, config: TablesConfig) -> None:
        self.spark = spark
        self.config = config
        self._cache: dict[tuple[str, str], SourceInfo | SourceTableError] = {}

    def path_for(self, database: str, table: str) -> str:
        qualified(database, table)  # validates both names before they reach a path
        return f"{self.config.warehouse.rstrip('/')}/{database}/{table}"

    def _delta_table(self, database: str, table: str) -> tuple[str, DeltaTable]:
        if self.config.resolution == "path":
            path = self.path_for(database, table)
            name = f"{database}.{table} ({path})"
            if not DeltaTable.isDeltaTable(self.spark, path):
                raise SourceTableError(f"source {name} does not exist or is not a Delta table")
            return name, DeltaTable.forPath(self.spark, path)
        parts = [p for p in (self.config.catalog, database, table) if p]
        name = qualified(*parts)
        if not self.spark.catalog.tableExists(name):
            raise SourceTableError(f"source table {name} does not exist")
        try:
            return name, DeltaTable.forName(self.spark, name)
        except AnalysisException as exc:
            raise SourceTableError(f"source table {name} is not a Delta table: {exc}") from None

    def describe(self, database: str, table: str) -> SourceInfo:
        """Identity and columns of a source table, or SourceTableError."""
        cached = self._cache.get((database, table))
        if isinstance(cached, SourceTableError):
            raise cached
        if cached is not None:
            return cached
        try:
            name, delta_table = self._delta_table(database, table)
            detail = delta_table.detail().select("id", "format").first()
            columns = tuple(delta_table.toDF().columns)
        except SourceTableError as exc:
            self._cache[(database, table)] = exc
            raise
        except AnalysisException as exc:
            error = SourceTableError(f"source {database}.{table} cannot be read: {exc}")
            self._cache[(database, table)] = error
            raise error from None
        except Exception as exc:  # storage or cluster trouble: worth a retry
            raise TemporaryError(f"could not describe source {database}.{table}: {exc}") from exc
        if detail is None or detail["format"] != "delta":
            error = SourceTableError(f"source {name} is not a Delta table")
            self._cache[(database, table)] = error
            raise error
        info = SourceInfo(name=name, table_id=str(detail["id"]), columns=columns)
        self._cache[(database, table)] = info
        return info

    def check(self, key: JobKey, spec: JobSpec) -> str:
        """Validate a spec against its source (exists, is Delta, has the columns)."""
        info = self.describe(key.database, key.table)
        consumer = spec.iteration.consumer
        needed = get_consumer_type(consumer.type).source_columns(consumer.options)
        present = {c.lower() for c in info.columns}
        missing = [c for c in needed if c.lower() not in present]
        if missing:
            raise SourceTableError(
                f"source {info.name} has no column(s) {missing} named by the "
                f"{consumer.type} consumer; its columns are {list(info.columns)}",
                ErrorCode.SOURCE_COLUMN_MISSING,
            )
        return info.table_id

    def forget(self) -> None:
        """Drop cached lookups (called at the start of every micro-batch)."""
        self._cache.clear()
