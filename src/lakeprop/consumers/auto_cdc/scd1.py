"""SCD type 1: per key, the row its events leave, whatever order they arrive in.

The target holds each key's row and ``__SEQUENCE``, the sequence of the latest
upsert applied to it (with ``ignore_null_updates`` also ``__COLUMN_SEQUENCES``:
per column, the sequence its value came from). A tombstone table next to it
(``<target>__tombstones``, appended to: a key's highest delete counts) remembers,
for ``tombstone_retention``, each deleted key's deletes and every truncate. Those are what it takes
to decide a late event where the events of one range meet the target:

* ``L``, a key's reset point, is the highest of its deletes (in the range or
  remembered): upserts at or below it are dead. The highest truncate ``T``
  kills what is below it (an upsert at its very sequence comes after it).
* Of the live upserts of a key in the range, the highest (``R``) wins over the
  target's row when it is higher than the row's ``__SEQUENCE``; a reset above the
  row's ``__SEQUENCE`` with no live upsert above it deletes the row. With
  ``ignore_null_updates`` each column takes the latest live non-NULL value among
  the row's and the range's.

One MERGE applies a range (its source: one row per key of the range), so the
cost is the DIY upsert's; a truncate in the range adds a clause that reaches
every target row. Writes are idempotent per range (Delta transaction ids); a
range applied again changes nothing, and one overlapping it changes only what
is new, because equal sequences lose to the row already there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructField, StructType, TimestampType

from lakeprop.consumers.auto_cdc.events import (
    DELETE,
    OP,
    SEQ,
    TRUNCATE,
    UPSERT,
    EventError,
    Events,
    literal,
)
from lakeprop.consumers.auto_cdc.options import COLUMN_SEQUENCES, NAME, SEQUENCE, CdcOptions

KIND, DELETED_AT = "__KIND", "__DELETED_AT"
CONFLICT = "lakeprop_auto_cdc_conflict"
"""The marker of the error the MERGE raises on an event that contradicts a row's."""


@dataclass(frozen=True)
class Resets:
    """What a range resets: per key (``frame``), and the truncate that holds."""

    frame: DataFrame
    truncate: Any
    """The range's truncate when it is above the one remembered, else None."""
    new_truncate: bool
    """The range holds a truncate above the one remembered."""


@dataclass(frozen=True)
class Scd1:
    """One SCD type 1 job's target columns and options."""

    options: CdcOptions
    keys: Sequence[str]
    columns: Sequence[str]
    """Non-key target columns, in order."""
    seq_type: DataType

    @property
    def partial(self) -> bool:
        return self.options.ignore_null_updates

    # -- the tables' shapes ----------------------------------------------------------

    def tombstone_schema(self, key_fields: Sequence[StructField]) -> StructType:
        """Keys (NULL on the truncate row), the sequence, when, and which kind."""
        return StructType(
            [
                *[StructField(f.name, f.dataType, True) for f in key_fields],
                StructField(SEQUENCE, self.seq_type, True),
                StructField(DELETED_AT, TimestampType(), True),
                StructField(KIND, StringType(), True),
            ]
        )

    # -- one range -------------------------------------------------------------------

    def resets(self, events: Events, tombstones: DataFrame | None) -> Resets:
        """Per key of the range: its reset point ``__L``, the latest of its deletes
        (``__D``: in the range; ``__D_old``: remembered), and ``__T``, the truncate
        that holds (remembered, or the range's). The remembered truncate is joined
        in, not read apart: only a range with a truncate of its own reads it, to
        know whether its truncate is new."""
        frame = events.frame
        per_key = (
            frame.where(F.col(OP) != TRUNCATE)
            .groupBy(*self.keys)
            .agg(F.max(F.when(F.col(OP) == DELETE, F.col(SEQ))).alias("__D"))
        )
        remembered: Any = None
        if tombstones is not None:
            held = (
                tombstones.where(F.col(KIND) == DELETE)
                .groupBy(*self.keys)
                .agg(F.max(SEQUENCE).alias("__D_old"))
            )
            truncated = tombstones.where(F.col(KIND) == TRUNCATE).agg(
                F.max(SEQUENCE).alias("__T_old")
            )
            per_key = per_key.join(held, list(self.keys), "left").crossJoin(truncated)
            if events.latest_truncate is not None:
                row = truncated.first()
                remembered = None if row is None else row[0]
        else:
            per_key = per_key.withColumn("__D_old", _null(self.seq_type)).withColumn(
                "__T_old", _null(self.seq_type)
            )
        reset = F.greatest(F.col("__D"), F.col("__D_old"))
        truncate = F.greatest(F.col("__T_old"), literal(events.latest_truncate, self.seq_type))
        new_truncate = events.latest_truncate is not None and (
            remembered is None or events.latest_truncate > remembered
        )
        return Resets(
            per_key.select(*self.keys, "__D", "__D_old", reset.alias("__L"), truncate.alias("__T")),
            events.latest_truncate if new_truncate else None,
            new_truncate,
        )

    def source(self, events: Events, resets: Resets) -> DataFrame:
        """One row per key of the range: its resets, ``__R`` (the highest live upsert)
        and the values it brings (with ``ignore_null_updates``, per column ``__v_<c>``
        and ``__s_<c>``: the latest non-NULL value and its sequence)."""
        live = (
            events.frame.where(F.col(OP) == UPSERT)
            .join(resets.frame.select(*self.keys, "__L", "__T"), list(self.keys))
            .where(self.survives(F.col(SEQ), F.col("__L"), F.col("__T")))
        )
        if self.partial:
            aggregates = [F.max(SEQ).alias("__R")]
            for i, c in enumerate(self.columns):
                known = F.when(F.col(c).isNotNull(), F.col(SEQ))
                aggregates += [F.max_by(c, known).alias(f"__v{i}"), F.max(known).alias(f"__s{i}")]
        else:
            latest = F.max_by(F.struct(*[F.col(c) for c in self.columns]), F.col(SEQ))
            aggregates = [F.max(SEQ).alias("__R"), latest.alias("__row")]
        upserts = live.groupBy(*self.keys).agg(*aggregates)
        return resets.frame.join(upserts, list(self.keys), "left")

    @staticmethod
    def survives(sequence: Column, reset: Column, truncate: Column) -> Column:
        """Whether an upsert (or a value) at ``sequence`` outlives the key's deletes up to
        ``reset`` and the ``truncate``: after a delete, at or after a truncate."""
        return (reset.isNull() | (sequence > reset)) & (truncate.isNull() | (sequence >= truncate))

    def value(self, i: int, alias: str = "s") -> Column:
        """The range's value of column ``i`` in the MERGE source."""
        if self.partial:
            return F.col(f"{alias}.__v{i}")
        return F.col(f"{alias}.__row")[self.columns[i]]

    def new_rows(self, source: DataFrame) -> DataFrame:
        """The target rows of keys with no row yet (a snapshot's, or the inserts of a MERGE)."""
        live = source.alias("s").where(F.col("s.__R").isNotNull())
        values = [self.value(i).alias(c) for i, c in enumerate(self.columns)]
        extra = [F.col("s.__R").alias(SEQUENCE)]
        if self.partial:
            extra.append(
                F.struct(*[F.col(f"s.__s{i}").alias(c) for i, c in enumerate(self.columns)]).alias(
                    COLUMN_SEQUENCES
                )
            )
        return live.select(*[F.col(f"s.{k}").alias(k) for k in self.keys], *values, *extra)

    def merge(
        self, target: DeltaTable, source: DataFrame, resets: Resets, bounds: list[Column]
    ) -> Any:
        """The MERGE of one range's source into the target (not executed)."""
        on = reduce(
            lambda a, b: a & b, [F.col(f"t.{k}") == F.col(f"s.{k}") for k in self.keys] + bounds
        )
        merge = target.alias("t").merge(source.alias("s"), on)
        merge = self._partial_clauses(merge) if self.partial else self._whole_clauses(merge)
        merge = merge.whenNotMatchedInsert(
            condition=F.col("s.__R").isNotNull(), values=self._insert_values()
        )
        if resets.new_truncate:
            below = F.col(f"t.{SEQUENCE}") < literal(resets.truncate, self.seq_type)
            merge = merge.whenNotMatchedBySourceDelete(condition=below)
            if self.partial:
                merge = self._truncate_columns(merge, resets.truncate)
        return merge

    def _insert_values(self) -> dict[str, str | Column]:
        values: dict[str, str | Column] = {k: F.col(f"s.{k}") for k in self.keys}
        values.update({c: self.value(i) for i, c in enumerate(self.columns)})
        values[SEQUENCE] = F.col("s.__R")
        if self.partial:
            values[COLUMN_SEQUENCES] = F.struct(
                *[F.col(f"s.__s{i}").alias(c) for i, c in enumerate(self.columns)]
            )
        return values

    def _conflict(self) -> dict[str, Column]:
        """A MERGE assignment that fails the MERGE naming the key (a conflict)."""
        first = self.columns[0] if self.columns else SEQUENCE
        key = F.to_json(F.struct(*[F.col(f"s.{k}").alias(k) for k in self.keys]))
        return {first: F.raise_error(F.concat(F.lit(f"{CONFLICT}: "), key))}

    def _whole_clauses(self, merge: Any) -> Any:
        newer = F.col("s.__R") > F.col(f"t.{SEQUENCE}")
        same = F.col("s.__R") == F.col(f"t.{SEQUENCE}")
        differs = ~F.struct(*[F.col(f"t.{c}") for c in self.columns]).eqNullSafe(F.col("s.__row"))
        return (
            merge.whenMatchedUpdate(condition=same & differs, set=self._conflict())
            .whenMatchedUpdate(
                condition=newer,
                set={
                    **{c: self.value(i) for i, c in enumerate(self.columns)},
                    SEQUENCE: F.col("s.__R"),
                },
            )
            .whenMatchedDelete(
                condition=~self.survives(F.col(f"t.{SEQUENCE}"), F.col("s.__L"), F.col("s.__T"))
            )
        )

    def _partial_clauses(self, merge: Any) -> Any:
        reset, truncate = F.col("s.__L"), F.col("s.__T")
        alive = self.survives(F.col(f"t.{SEQUENCE}"), reset, truncate)
        new_seq = F.greatest(F.col("s.__R"), F.when(alive, F.col(f"t.{SEQUENCE}")))
        values: dict[str, str | Column] = {}
        sequences = []
        changed = ~new_seq.eqNullSafe(F.col(f"t.{SEQUENCE}"))
        for i, c in enumerate(self.columns):
            held = F.col(f"t.{COLUMN_SEQUENCES}")[c]
            valid = held.isNotNull() & self.survives(held, reset, truncate)
            brought = F.col(f"s.__s{i}")
            take = brought.isNotNull() & (~valid | (brought > held))
            value = F.when(take, F.col(f"s.__v{i}")).when(valid, F.col(f"t.{c}"))
            sequence = F.when(take, brought).when(valid, held)
            values[c] = value
            sequences.append(sequence.alias(c))
            changed = changed | ~value.eqNullSafe(F.col(f"t.{c}")) | ~sequence.eqNullSafe(held)
        values[SEQUENCE] = new_seq
        values[COLUMN_SEQUENCES] = F.struct(*sequences)
        return (
            merge.whenMatchedUpdate(condition=self._partial_conflict(), set=self._conflict())
            .whenMatchedDelete(condition=new_seq.isNull())
            .whenMatchedUpdate(condition=changed, set=values)
        )

    def _partial_conflict(self) -> Column:
        """With ``ignore_null_updates``: the range's latest upsert has the sequence of the
        row's, but brings other content. At that sequence each column's value came
        from the event or did not (NULL): the two events differ when one brought a
        column the other did not, or both did with other values."""
        top = F.col(f"t.{SEQUENCE}")
        same = F.col("s.__R") == top
        differs = F.lit(False)
        for i, c in enumerate(self.columns):
            theirs = F.coalesce(F.col(f"t.{COLUMN_SEQUENCES}")[c] == top, F.lit(False))
            ours = F.coalesce(F.col(f"s.__s{i}") == top, F.lit(False))
            other = ~F.col(f"s.__v{i}").eqNullSafe(F.col(f"t.{c}"))
            differs = differs | (theirs != ours) | (theirs & ours & other)
        return same & differs

    def _truncate_columns(self, merge: Any, truncate: Any) -> Any:
        """A truncate also empties the columns of surviving rows whose values came
        from before it (they were set by upserts the truncate removed)."""
        cut = literal(truncate, self.seq_type)
        older = [F.col(f"t.{COLUMN_SEQUENCES}")[c] < cut for c in self.columns]
        if not older:
            return merge
        values: dict[str, str | Column] = {
            c: F.when(~old, F.col(f"t.{c}")) for c, old in zip(self.columns, older, strict=True)
        }
        values[COLUMN_SEQUENCES] = F.struct(
            *[
                F.when(~old, F.col(f"t.{COLUMN_SEQUENCES}")[c]).alias(c)
                for c, old in zip(self.columns, older, strict=True)
            ]
        )
        return merge.whenNotMatchedBySourceUpdate(
            condition=reduce(lambda a, b: a | b, older), set=values
        )

    def tombstones(self, source: DataFrame, resets: Resets, spark: SparkSession) -> DataFrame:
        """The tombstones a range adds, from its MERGE ``source``: each key's delete above
        the one remembered, and a new truncate (keys NULL)."""
        now = F.lit(time.time()).cast("timestamp")
        frame = source
        deleted = frame.where(
            F.col("__D").isNotNull()
            & (F.col("__D_old").isNull() | (F.col("__D") > F.col("__D_old")))
        ).select(
            *self.keys,
            F.col("__D").alias(SEQUENCE),
            now.alias(DELETED_AT),
            F.lit(DELETE).alias(KIND),
        )
        if not resets.new_truncate:
            return deleted
        row = spark.range(1).select(
            *[F.lit(None).cast(frame.schema[k].dataType).alias(k) for k in self.keys],
            literal(resets.truncate, self.seq_type).alias(SEQUENCE),
            now.alias(DELETED_AT),
            F.lit(TRUNCATE).alias(KIND),
        )
        return deleted.unionByName(row)

    def expired(self, tombstones: DataFrame, retention: float) -> Column:
        """The tombstones past ``tombstone_retention``."""
        return F.col(DELETED_AT) < F.lit(time.time() - retention).cast("timestamp")


def _null(data_type: DataType) -> Column:
    return F.lit(None).cast(data_type)


def _greatest_value(*values: Any) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def conflict_error(exc: Exception, source: str) -> EventError | None:
    """The MERGE's raised conflict as a permanent error, or None for any other failure."""
    text = str(exc)
    if CONFLICT not in text:
        return None
    found = text[text.index(CONFLICT) + len(CONFLICT) + 2 :].splitlines()[0][:500]
    return EventError(
        f"{NAME}: an event of {source} has the sequence of a key's current row but other "
        f"content (key {found}); two different events at one key and sequence are an "
        "error, and nothing of the range was written"
    )
