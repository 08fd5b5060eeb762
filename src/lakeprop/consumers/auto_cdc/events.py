"""From a change set (or a snapshot) to validated, distinct change events.

An *event source* is a table of events: each inserted row is one event, its
sequence the ``sequence_by`` column(s) (a struct, ordered field by field, for
several), a delete or a truncate when ``apply_as_deletes`` / ``apply_as_truncates``
say so. A *table source* is an ordinary table whose Change Data Feed is the
event stream: an insert or an update's post-image is an upsert, a delete a
delete, at the commit version (or ``_commit_timestamp``).

Every event frame has the key columns, ``__seq``, ``__op`` and the target
columns (NULL for deletes and truncates). Before anything is written:

* an update or delete of an event table's rows is an error;
* rows with a NULL key or sequence are an error, or with ``quarantine`` go to
  the quarantine table;
* identical events (same key, sequence and content) count once; two different
  events at one key and sequence are an error naming up to ten of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, VariantType

from lakeprop.changes.latest import LEAVES
from lakeprop.consumers.auto_cdc.options import NAME, CdcOptions
from lakeprop.errors import ErrorCode, PermanentError

SEQ, OP = "__seq", "__op"
VERSION = "__source_version"
"""A quarantined row's source version (its commit's, or the snapshot's)."""
UPSERT, DELETE, TRUNCATE = "upsert", "delete", "truncate"
EXAMPLES = 10


class EventError(PermanentError):
    """Events that cannot be applied: the range is not written."""

    default_code = ErrorCode.CONSUMER_FAILED


@dataclass(frozen=True)
class Events:
    """The distinct, valid events of a range, held (checkpointed)."""

    frame: DataFrame
    seq_type: DataType
    latest_truncate: Any
    """The highest sequence of a truncate among them, or None."""
    deletes: int = 0
    """How many of them are deletes."""
    quarantined: DataFrame | None = None
    """Rows with a NULL key or sequence, with ``__reason``, when ``quarantine`` is on."""


def sequence_column(options: CdcOptions) -> Column:
    names = options.sequence_by
    if len(names) == 1:
        return F.col(names[0])
    return F.struct(*[F.col(n) for n in names])


def _op_of_event_row(options: CdcOptions) -> Column:
    op = F.lit(UPSERT)
    if options.apply_as_deletes:
        op = F.when(F.coalesce(F.expr(options.apply_as_deletes), F.lit(False)), DELETE).otherwise(
            op
        )
    if options.apply_as_truncates:
        op = F.when(
            F.coalesce(F.expr(options.apply_as_truncates), F.lit(False)), TRUNCATE
        ).otherwise(op)
    return op


def raw_events(rows: DataFrame, options: CdcOptions, columns: list[str]) -> DataFrame:
    """The events of an event table's rows (a snapshot's rows, or a change set, whose
    ``_change_type`` stays on for :func:`prepare` to check)."""
    op = _op_of_event_row(options)
    values = [F.when(op == UPSERT, F.col(c)).alias(c) for c in columns]
    carried = [c for c in ("_change_type", "_commit_version") if c in rows.columns]
    return rows.select(
        *options.keys, sequence_column(options).alias(SEQ), op.alias(OP), *values, *carried
    )


def without_change_commits(changes: DataFrame) -> DataFrame:
    """An event table's change set without the commits that updated or deleted event
    rows (retention deletes, corrections): ``skip_change_commits``."""
    changed = changes.where(F.col("_change_type") != "insert").select("_commit_version")
    return changes.join(changed.distinct(), "_commit_version", "left_anti")


def table_changes(changes: DataFrame, options: CdcOptions, columns: list[str]) -> DataFrame:
    """The events of a table source's change feed: per key and commit, the change the
    commit leaves (an insert after a delete in one commit is the row it wrote), as
    :func:`~lakeprop.changes.latest_change_per_key` ranks them. A key whose only
    change in a commit is an update's pre-image left the table (the update changed
    a key column): a delete, as AUTO CDC FROM SNAPSHOT would see it."""
    kind = F.col("_change_type")
    rank = F.when(kind.isin(*LEAVES), 1).otherwise(0)
    last = Window.partitionBy(*options.keys, "_commit_version").orderBy(F.desc("_rank"))
    seq = sequence_column(options)
    kept = (
        changes.withColumn("_rank", rank)
        .withColumn("_n", F.row_number().over(last))
        .where(F.col("_n") == 1)
    )
    op = F.when(kind.isin(*LEAVES), UPSERT).otherwise(DELETE)
    values = [F.when(op == UPSERT, F.col(c)).alias(c) for c in columns]
    return kept.select(*options.keys, seq.alias(SEQ), op.alias(OP), *values)


def table_snapshot(
    rows: DataFrame, options: CdcOptions, columns: list[str], commit: Mapping[str, Any]
) -> DataFrame:
    """A table source's rows as upserts at the snapshot's commit: ``commit`` gives the
    value of each change feed column the sequence is made of (``_commit_version``,
    ``_commit_timestamp``), typed as the tails' change feed types them, so the
    snapshot's sequence and the tails' are one type, made by :func:`sequence_column`."""
    types = {"_commit_version": "long", "_commit_timestamp": "timestamp"}
    stamped = rows.select(
        "*", *[F.lit(commit[c]).cast(types[c]).alias(c) for c in options.sequence_by]
    )
    seq = sequence_column(options)
    return stamped.select(*options.keys, seq.alias(SEQ), F.lit(UPSERT).alias(OP), *columns)


def reject_updates_of_events(changes: DataFrame, source: str, changed: int) -> None:
    """An event table's rows are only ever inserted: ``changed`` change rows that
    update or delete them are an error (the versions named, read only then)."""
    if changed:
        versions = (
            changes.where(F.col("_change_type") != "insert")
            .select("_commit_version")
            .distinct()
            .orderBy("_commit_version")
            .limit(EXAMPLES)
            .collect()
        )
        raise EventError(
            f"{NAME}: source {source} is an event source, whose rows are only ever inserted, "
            f"but version(s) {[r[0] for r in versions]} changed {changed} existing row(s); "
            "register it with source_kind 'table' to follow its changes, or resync"
        )


def _invalid(events: DataFrame, options: CdcOptions) -> Column:
    """Why an event cannot be applied (NULL when it can)."""
    null_key = reduce(lambda a, b: a | b, [F.col(k).isNull() for k in options.keys])
    is_truncate = F.col(OP) == TRUNCATE
    return F.when(F.col(SEQ).isNull() | _has_null_field(events, SEQ), F.lit("NULL sequence")).when(
        ~is_truncate & null_key, F.lit("NULL key")
    )


def _has_null_field(events: DataFrame, column: str) -> Column:
    data_type = events.schema[column].dataType
    names = getattr(data_type, "names", None)
    if not names:
        return F.lit(False)
    return reduce(lambda a, b: a | b, [F.col(column)[n].isNull() for n in names])


def prepare(
    events: DataFrame, options: CdcOptions, source: str, from_version: int, to_version: int
) -> Events:
    """Validate and de-duplicate ``events``; raise :class:`EventError` on what cannot be
    applied, before anything is written.

    One Spark job holds the distinct events; what the checks need (rows that
    changed existing event rows, rows with a NULL key or sequence, conflicting
    events, the latest truncate, the deletes) is observed as it runs.
    """
    seq_type = events.schema[SEQ].dataType
    inserted = (
        F.col("_change_type") == "insert" if "_change_type" in events.columns else F.lit(True)
    )
    rows_seen = Observation("auto_cdc rows")
    checked = (
        events.withColumn("__reason", _invalid(events, options))
        .observe(
            rows_seen,
            F.sum((~inserted).cast("int")).alias("changed"),
            F.sum((inserted & F.col("__reason").isNotNull()).cast("int")).alias("bad"),
        )
        .where(inserted)
        .drop("_change_type")
    )
    if "_commit_version" in checked.columns:  # a quarantined row keeps the version it came in
        checked = checked.withColumnRenamed("_commit_version", VERSION)
    good = checked.where(F.col("__reason").isNull()).drop("__reason", VERSION)
    columns = [c for c in good.columns if c not in (*options.keys, SEQ, OP)]
    content = F.struct(F.col(OP), *[F.col(c) for c in columns])
    slot = [F.when(F.col(OP) != TRUNCATE, F.col(k)).alias(k) for k in options.keys]
    events_seen = Observation("auto_cdc events")
    grouped = (
        good.select(*slot, F.col(SEQ), content.alias("__event"))
        .groupBy(*options.keys, SEQ)
        .agg(*_distinct_events(good.select(content.alias("e")).schema["e"].dataType))
        .observe(
            events_seen,
            F.sum(F.when(F.col("__kinds") > 1, 1).otherwise(0)).alias("conflicts"),
            F.max(F.when(F.col("__event")[OP] == TRUNCATE, F.col(SEQ))).alias("truncate"),
            F.sum((F.col("__event")[OP] == DELETE).cast("int")).alias("deletes"),
        )
        .localCheckpoint()
    )
    counts, summary = rows_seen.get, events_seen.get
    reject_updates_of_events(events, source, counts.get("changed") or 0)
    quarantined = None
    bad_count = counts.get("bad") or 0
    if bad_count:
        bad = checked.where(F.col("__reason").isNotNull())
        if not options.quarantine:
            examples = [
                {k: r[k] for k in (*options.keys, SEQ, "__reason")} for r in bad.limit(3).collect()
            ]
            raise EventError(
                f"{NAME}: {bad_count} event(s) of versions {from_version + 1}..{to_version} of "
                f"{source} have a NULL key or sequence, e.g. {examples}; fix the source, or "
                "register the job with quarantine: true to set such rows aside"
            )
        quarantined = bad
    if summary.get("conflicts"):
        examples = [
            {**{k: r[k] for k in options.keys}, "sequence": r[SEQ]}
            for r in grouped.where(F.col("__kinds") > 1).limit(EXAMPLES).collect()
        ]
        raise EventError(
            f"{NAME}: {summary['conflicts']} key(s) of {source} have different events at one "
            f"sequence in versions {from_version + 1}..{to_version}, e.g. {examples}; nothing "
            "of that range was written"
        )
    frame = grouped.select(
        *options.keys,
        SEQ,
        F.col("__event")[OP].alias(OP),
        *[F.col("__event")[c].alias(c) for c in columns],
    )
    return Events(
        frame, seq_type, summary.get("truncate"), summary.get("deletes") or 0, quarantined
    )


def _distinct_events(event_type: DataType) -> list[Column]:
    """The aggregates of the events at one key and sequence: ``__kinds``, 1 when they
    are all the same event, more when not, and ``__event``, the event. Events whose
    type Spark can order are compared by their least and greatest, in the one
    aggregation; others (maps) by their JSON text."""
    event = F.col("__event")
    if _orderable(event_type):
        same = F.min(event).eqNullSafe(F.max(event))
        return [F.when(same, 1).otherwise(2).alias("__kinds"), F.min(event).alias("__event")]
    return [
        F.count_distinct(F.to_json(event)).alias("__kinds"),
        F.min_by(event, F.to_json(event)).alias("__event"),
    ]


def _orderable(data_type: DataType) -> bool:
    """Whether Spark compares values of ``data_type`` (maps and variants it does not)."""
    if isinstance(data_type, StructType):
        return all(_orderable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _orderable(data_type.elementType)
    return not isinstance(data_type, MapType | VariantType)


def literal(value: Any, data_type: DataType) -> Column:
    """A sequence value collected to the driver (a scalar, or a Row for several
    columns), as a literal of the sequence's type; NULL for None."""
    if value is None:
        return F.lit(None).cast(data_type)
    if isinstance(value, tuple):
        names = getattr(data_type, "names", [])
        return F.struct(*[F.lit(v).alias(n) for v, n in zip(value, names, strict=True)]).cast(
            data_type
        )
    return F.lit(value).cast(data_type)
