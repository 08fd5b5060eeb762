"""``replica``: a Delta copy of chosen columns of the source, keyed by primary key.

A snapshot overwrites the target; a tail applies the last change of each key in
the range with one MERGE (delete, update or insert), so the replica equals the
source's chosen columns at the watermark version. Applying a range again, or an
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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from lakeprop.consumers import ConsumerType, InvalidConsumerOptionsError, reject_unknown_options
from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.errors import ErrorCode, InvalidIdentifierError, PermanentError
from lakeprop.identifiers import validate_identifier
from lakeprop.spec import JobKey

if TYPE_CHECKING:
    from lakeprop.tables.resolve import TableHandle

_ALLOWED = {"primary_key", "columns", "target_database", "target_table"}


def identifier_list(value: object, consumer: str, what: str) -> list[str]:
    """A required, non-empty list of distinct column names."""
    if value is None:
        raise InvalidConsumerOptionsError(f"{consumer} option {what} is required")
    if not isinstance(value, list) or not value:
        raise InvalidConsumerOptionsError(
            f"{consumer} option {what} must be a non-empty list of column names"
        )
    names = [validate_identifier(v, f"{consumer} option {what} entry") for v in value]
    if len({n.lower() for n in names}) != len(names):
        raise InvalidConsumerOptionsError(f"{consumer} option {what} lists a column twice")
    return names


def target_options(options: Mapping[str, Any]) -> dict[str, str | None]:
    """The optional target_database / target_table options, validated."""
    return {
        name: None if options.get(name) is None else validate_identifier(options[name], name)
        for name in ("target_database", "target_table")
    }


def target_table(key: JobKey, options: Mapping[str, Any]) -> tuple[str, str]:
    """(database, table) of a consumer's target: the options' target_database and
    target_table, or <source database>.<source table>_<job name>."""
    return (
        options.get("target_database") or key.database,
        options.get("target_table") or f"{key.table}_{key.job_name}",
    )


def target_name(context: ConsumerContext) -> TableHandle:
    """The target table of the job ``context`` serves."""
    return context.locate(*target_table(context.key, context.options))


def validate_options(options: Mapping[str, Any]) -> dict[str, Any]:
    reject_unknown_options("replica", options, _ALLOWED)
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
    assert primary_key is not None
    if columns is not None:
        missing = [c for c in primary_key if c.lower() not in {x.lower() for x in columns}]
        if missing:
            raise InvalidConsumerOptionsError(
                f"replica option columns must include the primary key column(s) {missing}"
            )
    return out


def source_columns(options: Mapping[str, Any]) -> list[str]:
    return list(options["primary_key"]) + [
        c for c in (options.get("columns") or []) if c not in options["primary_key"]
    ]


def latest_change_per_key(changes: DataFrame, key: list[str]) -> DataFrame:
    """The last change of every key in commit order (pre-images dropped).

    Within one commit a key may be deleted and inserted again (an overwrite
    does that): the insert is the state the commit leaves, so it ranks last.
    """
    rank = F.when(F.col("_change_type") == "delete", 0).otherwise(1)
    order = Window.partitionBy(*key).orderBy(F.desc("_commit_version"), F.desc("_rank"))
    return (
        changes.where(F.col("_change_type") != "update_preimage")
        .withColumn("_rank", rank)
        .withColumn("_n", F.row_number().over(order))
        .where(F.col("_n") == 1)
        .drop("_n", "_rank")
    )


class ReplicaConsumer(Consumer):
    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        self.key: list[str] = list(context.options["primary_key"])
        self.columns: list[str] = self.target_columns()
        self.target = target_name(context)

    def target_columns(self) -> list[str]:
        """Columns of the target table, in order."""
        return list(self.context.options.get("columns") or self.context.source_columns)

    def snapshot(self, rows: DataFrame, version: int) -> int:
        data = rows.select(*self.columns)
        writer = (
            data.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .options(**self.context.writer_options(version))
        )
        self.target.save(writer)
        return int(data.count())

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        if not self.target.exists():
            raise PermanentError(
                f"replica target {self.target} is missing; re-register the job to rebuild it",
                ErrorCode.TARGET_MISSING,
            )
        latest = (
            latest_change_per_key(changes, self.key).select(*self.columns, "_change_type").persist()
        )
        try:
            written = int(latest.count())
            if written == 0:
                return 0
            on = reduce(lambda a, b: a & b, [F.col(f"t.{k}") == F.col(f"s.{k}") for k in self.key])
            values: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in self.columns}
            deleted = F.col("s._change_type") == "delete"
            with self.context.idempotent(to_version):
                (
                    self.target.delta()
                    .alias("t")
                    .merge(latest.alias("s"), on)
                    .whenMatchedDelete(condition=deleted)
                    .whenMatchedUpdate(set=values)
                    .whenNotMatchedInsert(condition=~deleted, values=values)
                    .execute()
                )
            return written
        finally:
            latest.unpersist()


CONSUMER_TYPE = ConsumerType(
    name="replica",
    validate_options=validate_options,
    source_columns=source_columns,
    factory=ReplicaConsumer,
)
