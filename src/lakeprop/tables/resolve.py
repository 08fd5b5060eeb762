"""Tables: from (database, table) to a Delta table, for sources and consumer targets.

A job names its source by database and table, and consumers name their targets
the same way. With ``tables.resolution =
"path"`` that is the directory ``<warehouse>/<database>/<table>``; with
``"metastore"`` it is the session catalog's table (Hive metastore or Unity
Catalog). The Delta table id is the table's identity (the catalog's table_id): a
table replaced under the same name gets a new id, and its jobs must be
re-registered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, DataFrameReader, DataFrameWriter, SparkSession
from pyspark.sql.types import StructType

from lakeprop import expectations
from lakeprop.config import TablesConfig
from lakeprop.errors import ErrorCode, SourceTableError, TemporaryError
from lakeprop.identifiers import qualified
from lakeprop.registry import ConsumerType, get_consumer_type
from lakeprop.spec import JobKey, JobSpec
from lakeprop.tables.conditions import check_condition
from lakeprop.tables.probe import DeltaLogProbe

CHANGE_FEED_PROPERTY = "delta.enableChangeDataFeed"
"""The table property that turns a Delta table's Change Data Feed on."""


@dataclass(frozen=True)
class SourceInfo:
    """What the service needs to know of a source table."""

    name: str
    table_id: str
    columns: tuple[str, ...]
    schema_json: str = ""
    """The source's schema (Spark's JSON form), for a consumer's ``check_source``."""
    change_feed: bool = False
    """Whether its Change Data Feed is on."""

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.schema_json))


@dataclass(frozen=True)
class TableHandle:
    """A Delta table by path or by metastore name: read, write, check, open."""

    spark: SparkSession
    path: str | None
    name: str | None

    def __str__(self) -> str:
        return self.name or str(self.path)

    def exists(self) -> bool:
        if self.path is not None:
            # The log's files first: no Spark job, where Delta's check of a table
            # another engine wrote loads its snapshot with one. Delta once said "no"
            # for a table whose log held a commit (a chaos round, cause not
            # established), so a table with commits is never taken for missing.
            return DeltaLogProbe(self.spark).latest_version(self.path) is not None or bool(
                DeltaTable.isDeltaTable(self.spark, self.path)
            )
        return bool(self.spark.catalog.tableExists(str(self.name)))

    @property
    def sql_name(self) -> str:
        """The table as Spark SQL names it (``delta.`<path>``` for a path table)."""
        if self.path is not None:
            return "delta.`" + self.path.replace("`", "``") + "`"
        return str(self.name)

    def delta(self) -> DeltaTable:
        if self.path is not None:
            return DeltaTable.forPath(self.spark, self.path)
        return DeltaTable.forName(self.spark, str(self.name))

    def location(self) -> str:
        if self.path is not None:
            return self.path
        detail = self.delta().detail().select("location").first()
        return str(detail["location"]) if detail is not None else ""

    def reader(self) -> DataFrameReader:
        return self.spark.read.format("delta")

    def load(self, reader: DataFrameReader) -> DataFrame:
        return reader.load(self.path) if self.path is not None else reader.table(str(self.name))

    def save(self, writer: DataFrameWriter) -> None:
        if self.path is not None:
            writer.save(self.path)
        else:
            writer.saveAsTable(str(self.name))

    def keep_change_feed(self) -> None:
        """Turn the table's change feed on where it is off (a table made before its
        writer asked for one: a write's table properties set only a new table's)."""
        properties = self.delta().detail().select("properties").first()
        if properties is None or properties["properties"].get(CHANGE_FEED_PROPERTY) != "true":
            self.spark.sql(
                f"ALTER TABLE {self.sql_name} SET TBLPROPERTIES ('{CHANGE_FEED_PROPERTY}' = 'true')"
            )


class Tables:
    """Resolves and describes tables; source lookups are cached per micro-batch."""

    def __init__(self, spark: SparkSession, config: TablesConfig) -> None:
        self.spark = spark
        self.config = config
        self._cache: dict[tuple[str, str], SourceInfo | SourceTableError] = {}
        self.probe = DeltaLogProbe(spark)

    def path_for(self, database: str, table: str) -> str:
        qualified(database, table)  # validates both names before they reach a path
        return f"{self.config.warehouse.rstrip('/')}/{database}/{table}"

    def handle(self, database: str, table: str, spark: SparkSession | None = None) -> TableHandle:
        """The table (database, table) resolves to, bound to ``spark`` (a worker's session)."""
        session = spark or self.spark
        if self.config.resolution == "path":
            return TableHandle(session, self.path_for(database, table), None)
        parts = [p for p in (self.config.catalog, database, table) if p]
        return TableHandle(session, None, qualified(*parts))

    def within(self, database: str, table: str, *locations: str) -> bool:
        """Whether the path table (database, table) lies in one of ``locations`` (the
        service's state): never for metastore tables, whose state lives by path."""
        if self.config.resolution != "path":
            return False
        path = self.path_for(database, table).rstrip("/") + "/"
        return any(path.startswith(loc.rstrip("/") + "/") for loc in locations)

    def location(self, database: str, table: str) -> str:
        """Storage location of a table (for the log probe)."""
        if self.config.resolution == "path":
            return self.path_for(database, table)
        detail = self.handle(database, table).delta().detail().select("location").first()
        if detail is None:
            raise SourceTableError(f"source {database}.{table} has no location")
        return str(detail["location"])

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
            from_log = self._from_log(database, table)
            if from_log is not None:
                self._cache[(database, table)] = from_log
                return from_log
            name, delta_table = self._delta_table(database, table)
            detail = delta_table.detail().select("id", "format", "properties").first()
            frame = delta_table.toDF()
            columns, schema_json = tuple(frame.columns), frame.schema.json()
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
        info = SourceInfo(
            name=name,
            table_id=str(detail["id"]),
            columns=columns,
            schema_json=schema_json,
            change_feed=(detail["properties"] or {}).get(CHANGE_FEED_PROPERTY) == "true",
        )
        self._cache[(database, table)] = info
        return info

    def _from_log(self, database: str, table: str) -> SourceInfo | None:
        """A path table described from its Delta log's JSON commits, without a Spark
        job; None when only Delta can tell (metastore tables, metadata in a checkpoint)."""
        if self.config.resolution != "path":
            return None
        path = self.path_for(database, table)
        name = f"{database}.{table} ({path})"
        if self.probe.latest_version(path) is None:
            raise SourceTableError(f"source {name} does not exist or is not a Delta table")
        metadata = self.probe.metadata(path)
        if metadata is None:
            return None
        return SourceInfo(
            name=name,
            table_id=metadata.table_id,
            columns=metadata.columns,
            schema_json=metadata.schema_json,
            change_feed=metadata.change_feed,
        )

    def check(self, key: JobKey, spec: JobSpec) -> str:
        """Validate a spec against its source (exists, is Delta, has the columns)."""
        info = self.describe(key.database, key.table)
        consumer = spec.iteration.consumer
        consumer_type = get_consumer_type(consumer.type)
        self._check_joined(key, consumer.type, consumer_type, consumer.options)
        rules = expectations.of(consumer.options)
        needed = consumer_type.source_columns(consumer.options) + expectations.columns(rules)
        present = {c.lower() for c in info.columns}
        missing = [c for c in needed if c.lower() not in present]
        if missing:
            raise SourceTableError(
                f"source {info.name} has no column(s) {missing} named by the "
                f"{consumer.type} consumer; its columns are {list(info.columns)}",
                ErrorCode.SOURCE_COLUMN_MISSING,
            )
        schema = info.schema()
        consumer_type.check_source(consumer.options, schema, self.spark)
        for rule in rules:
            if rule.check is not None:
                check_condition(self.spark, schema, rule.check, f"expectation {rule.name}")
        return info.table_id

    def _check_joined(
        self, key: JobKey, name: str, consumer_type: ConsumerType, options: Mapping[str, Any]
    ) -> None:
        """The tables a consumer reads beside the job's source (a join): registered on
        the table its options name first, each other one a Delta table with the
        columns they read and its change feed on."""
        own = consumer_type.own_source(options)
        if own is not None and (own[0].lower(), own[1].lower()) != (
            key.database.lower(),
            key.table.lower(),
        ):
            raise SourceTableError(
                f"the {name} job is registered on {key.database}.{key.table}, but its query "
                f"reads {own[0]}.{own[1]} first: register it on {own[0]}.{own[1]}",
                ErrorCode.INVALID_CONSUMER_OPTIONS,
            )
        for joined in consumer_type.joined_sources(options):
            info = self.describe(joined.database, joined.table)
            present = {c.lower() for c in info.columns}
            missing = [c for c in joined.columns if c.lower() not in present]
            if missing:
                raise SourceTableError(
                    f"the {name} job reads column(s) {missing} of {info.name}, which has "
                    f"none such; its columns are {list(info.columns)}",
                    ErrorCode.SOURCE_COLUMN_MISSING,
                )
            if not info.change_feed:
                raise SourceTableError(
                    f"the {name} job follows {info.name} by its change feed, which is off: "
                    f"ALTER TABLE {joined.database}.{joined.table} SET TBLPROPERTIES "
                    f"('{CHANGE_FEED_PROPERTY}' = 'true'), then register the job again",
                    ErrorCode.SOURCE_FEED_OFF,
                )

    def forget(self) -> None:
        """Drop cached lookups (called at the start of every micro-batch)."""
        self._cache.clear()
