"""SCD type 2: per key, the history its events imply, late events put in their place.

The target holds each key's versions ``[__START_AT, __END_AT)``: an upsert that
changes a tracked column closes the current version and opens one; one that
changes only untracked columns updates the current version in place; a delete
closes it. A late event can split any interval, and where it does depends on
every event of its key (an upsert that changed nothing then may change
something now), so the distinct events are kept in an event store next to the
target (``<target>__events``). A range then:

1. reads the stored events of the keys it touches (Delta skips the files whose
   key statistics lie outside the range's keys);
2. fails on a stored event at one key and sequence whose content differs;
3. folds all of those keys' events into versions, with window functions
   (:func:`fold`);
4. MERGEs only the difference from the target's versions of those keys, on
   (keys, ``__START_AT``), so the target's change feed shows true changes;
5. appends its new events to the store.

Most ranges only go on from where each key's history stands: every event is
later than every stored event of its key. Folding the key's open version (as
one upsert at its ``__START_AT``) with the range's events then gives the same
versions as folding every event (:meth:`Scd2.in_order`): the range reads only
each key's latest stored sequence, and folds none of its stored events. The
consumer takes that way when the target is in step with the store, and falls
back to the full fold when any event is late.

Both writes are idempotent per range (Delta transaction ids), and the fold
depends only on the events: a range applied again, or one overlapping it,
changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F

from lakeprop.consumers.auto_cdc.events import DELETE, OP, SEQ, UPSERT, EventError
from lakeprop.consumers.auto_cdc.options import END_AT, NAME, SEQUENCE, START_AT, CdcOptions

STORE_OP = "__OP"
ACTION = "__action"


@dataclass(frozen=True)
class Scd2:
    """One SCD type 2 job's target columns, tracked columns and options."""

    options: CdcOptions
    keys: Sequence[str]
    columns: Sequence[str]
    tracked: Sequence[str]

    def stored(self, events: DataFrame) -> DataFrame:
        """Events as the store keeps them."""
        return events.select(
            *self.keys,
            F.col(SEQ).alias(SEQUENCE),
            F.col(OP).alias(STORE_OP),
            *self.columns,
        )

    def as_events(self, store: DataFrame) -> DataFrame:
        return store.select(
            *self.keys, F.col(SEQUENCE).alias(SEQ), F.col(STORE_OP).alias(OP), *self.columns
        )

    def new_events(self, events: DataFrame, store: DataFrame, source: str) -> DataFrame:
        """The range's events not in the store yet; an error for one that contradicts a
        stored event of its key and sequence."""
        content = F.to_json(F.struct(F.col(OP), *[F.col(c) for c in self.columns]))
        keyed = [*self.keys, SEQ]
        mine = events.withColumn("__content", content)
        theirs = self.as_events(store).select(*keyed, content.alias("__stored"))
        joined = mine.join(theirs, keyed, "left")
        conflicts = joined.where(
            F.col("__stored").isNotNull() & (F.col("__stored") != F.col("__content"))
        )
        found = conflicts.select(*keyed).limit(10).collect()
        if found:
            examples = [{**{k: r[k] for k in self.keys}, "sequence": r[SEQ]} for r in found]
            raise EventError(
                f"{NAME}: events of {source} contradict events already applied at the same "
                f"key and sequence, e.g. {examples}; nothing of the range was written"
            )
        return joined.where(F.col("__stored").isNull()).drop("__content", "__stored")

    def lateness(self, events: DataFrame, store: DataFrame, late: Observation) -> DataFrame:
        """``events``, observed by ``late`` (as ``late``) for how many are not later
        than every event of their key in ``store``: to hold before :meth:`in_order`,
        so the figure is complete once the frame is."""
        key = list(self.keys)
        heads = store.groupBy(*key).agg(F.max(SEQUENCE).alias("__held"))
        is_late = F.col(SEQ) <= F.col("__held")
        return (
            events.join(heads, key, "left")
            .withColumn("__late", F.when(is_late, 1).otherwise(0))
            .drop("__held")
            .observe(late, F.sum("__late").alias("late"))
            .drop("__late")
        )

    def in_order(self, events: DataFrame, current: DataFrame) -> DataFrame:
        """The changes to the target's ``current`` versions of the range's keys that
        ``events`` make when each is later than every stored event of its key
        (:meth:`lateness` says whether they are): the fold of each key's open
        version, as an upsert at its start, and the events.

        The open version holds the last event's values (filled in, with
        ``ignore_null_updates``) and its tracked columns, which is all the fold
        carries from one event to the next within a key's segment; a key whose
        last event was a delete has no open version, and its events begin a new
        segment either way."""
        open_now = current.where(F.col(END_AT).isNull())
        seeds = open_now.select(
            *self.keys, F.col(START_AT).alias(SEQ), F.lit(UPSERT).alias(OP), *self.columns
        )
        return self.changes(self.fold(seeds.unionByName(events)), open_now)

    def fold(self, events: DataFrame) -> DataFrame:
        """Every key's versions from all its events, as sorted application gives them."""
        key = list(self.keys)
        by_key = Window.partitionBy(*key).orderBy(SEQ)
        is_delete = (F.col(OP) == DELETE).cast("int")
        marked = events.withColumn(
            "__seg",
            F.coalesce(
                F.sum(is_delete).over(by_key.rowsBetween(Window.unboundedPreceding, -1)), F.lit(0)
            ),
        )
        closes = (
            marked.where(F.col(OP) == DELETE)
            .groupBy(*key, "__seg")
            .agg(F.min(SEQ).alias("__closed_at"))
        )
        upserts = marked.where(F.col(OP) == UPSERT)
        segment = Window.partitionBy(*key, "__seg").orderBy(SEQ)
        if self.options.ignore_null_updates:
            so_far = segment.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            upserts = upserts.select(
                *key,
                "__seg",
                SEQ,
                *[F.last(c, ignorenulls=True).over(so_far).alias(c) for c in self.columns],
            )
        tracked = F.struct(*[F.col(c) for c in self.tracked]) if self.tracked else F.lit(0)
        starts = (
            upserts.withColumn("__tracked", tracked)
            .withColumn("__before", F.lag("__tracked").over(segment))
            .withColumn(
                "__starts",
                (
                    F.col("__before").isNull() | ~F.col("__tracked").eqNullSafe(F.col("__before"))
                ).cast("int"),
            )
            .withColumn("__vid", F.sum("__starts").over(segment))
        )
        versions = starts.groupBy(*key, "__seg", "__vid").agg(
            F.min(SEQ).alias(START_AT),
            F.max_by(F.struct(*[F.col(c) for c in self.columns]), F.col(SEQ)).alias("__last"),
        )
        following = Window.partitionBy(*key, "__seg").orderBy(START_AT)
        return (
            versions.withColumn("__next", F.lead(START_AT).over(following))
            .join(closes, [*key, "__seg"], "left")
            .select(
                *key,
                *[F.col("__last")[c].alias(c) for c in self.columns],
                F.col(START_AT),
                F.coalesce(F.col("__next"), F.col("__closed_at")).alias(END_AT),
            )
        )

    def changes(self, versions: DataFrame, current: DataFrame) -> DataFrame:
        """What turns the target's ``current`` versions of some keys into ``versions``:
        one row per version to insert, update or delete (``__action``)."""
        on = [*self.keys, START_AT]
        shape = [*self.columns, END_AT]
        new = versions.select(*on, F.struct(*shape).alias("__new"))
        old = current.select(*on, F.struct(*shape).alias("__old"))
        joined = new.join(old, on, "full")
        action = (
            F.when(F.col("__old").isNull(), "insert")
            .when(F.col("__new").isNull(), "delete")
            .when(~F.col("__new").eqNullSafe(F.col("__old")), "update")
        )
        return (
            joined.withColumn(ACTION, action)
            .where(F.col(ACTION).isNotNull())
            .select(*on, *[F.col("__new")[c].alias(c) for c in shape], ACTION)
        )

    def merge(self, target: DeltaTable, changes: DataFrame, bounds: list[Column]) -> Any:
        on = reduce(
            lambda a, b: a & b,
            [F.col(f"t.{c}") == F.col(f"s.{c}") for c in (*self.keys, START_AT)] + bounds,
        )
        values: dict[str, str | Column] = {
            c: F.col(f"s.{c}") for c in (*self.keys, *self.columns, START_AT, END_AT)
        }
        action = F.col(f"s.{ACTION}")
        return (
            target.alias("t")
            .merge(changes.alias("s"), on)
            .whenMatchedDelete(condition=action == "delete")
            .whenMatchedUpdate(condition=action == "update", set=values)
            .whenNotMatchedInsert(condition=action == "insert", values=values)
        )
