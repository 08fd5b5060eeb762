"""One seeded workload generator: random commits that stress incremental consumers.

Each call to :meth:`Workload.burst` makes several Delta commits on one source
table: inserts, updates and deletes of random rows, NULL values, rows moving
between groups, and on purpose the shapes that break incremental maintenance
when several commits fall into one range: a group born and emptied again, a
new extreme value inserted and removed again, an update that moves a group's
extreme away, and now and then the whole table emptied.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

SCHEMA = "id INT, g STRING, v INT, body STRING"
GROUPS = ("a", "b", "c")
WORDS = ("delta", "Lake", "the", "merge", "café", "log", "x", "Stream", "and", "kafka")

Row = tuple[int, str | None, int | None, str | None]


@dataclass
class Workload:
    """Random commits on one table; ``live`` mirrors the ids the table holds."""

    spark: SparkSession
    path: str
    seed: int
    live: set[int] = field(default_factory=set)
    commits: int = 0
    next_id: int = 1
    fresh_groups: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # -- values -----------------------------------------------------------------------

    def value(self) -> int | None:
        return None if self.rng.random() < 0.2 else self.rng.randint(-20, 20)

    def text(self) -> str | None:
        if self.rng.random() < 0.15:
            return None
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(0, 5)))

    def group(self) -> str | None:
        return None if self.rng.random() < 0.1 else self.rng.choice(GROUPS)

    # -- commits ----------------------------------------------------------------------

    def insert(
        self, n: int | None = None, fixed: tuple[str | None, int | None] | None = None
    ) -> list[int]:
        """Insert ``n`` rows (random by default), with ``fixed`` (group, value) if given."""
        ids = list(range(self.next_id, self.next_id + (n or self.rng.randint(1, 5))))
        self.next_id += len(ids)
        rows: list[Row] = [(i, *(fixed or (self.group(), self.value())), self.text()) for i in ids]
        self.spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(
            self.path
        )
        self.live.update(ids)
        self.commits += 1
        return ids

    def update(self, ids: list[int] | None = None) -> None:
        ids = ids or self.sample(4)
        if not ids:
            return
        changes: dict[str, str | Column] = {}
        if self.rng.random() < 0.5:
            group = self.group()
            changes["g"] = F.lit(group).cast("string")
        if self.rng.random() < 0.7 or not changes:
            value = self.value()
            changes["v"] = F.lit(value).cast("int")
        if self.rng.random() < 0.5:
            changes["body"] = F.lit(self.text()).cast("string")
        DeltaTable.forPath(self.spark, self.path).update(F.col("id").isin(ids), changes)
        self.commits += 1

    def delete(self, ids: list[int] | None = None) -> None:
        ids = ids if ids is not None else self.sample(3)
        if not ids:
            return
        DeltaTable.forPath(self.spark, self.path).delete(F.col("id").isin(ids))
        self.live.difference_update(ids)
        self.commits += 1

    def sample(self, most: int) -> list[int]:
        if not self.live:
            return []
        return self.rng.sample(sorted(self.live), k=min(len(self.live), self.rng.randint(1, most)))

    # -- shapes that span commits ------------------------------------------------------

    def group_born_and_emptied(self) -> None:
        self.fresh_groups += 1
        ids = self.insert(self.rng.randint(1, 3), (f"new{self.fresh_groups}", self.value()))
        self.delete(ids)

    def extreme_inserted_and_removed(self) -> None:
        extreme = self.rng.choice([-1000, 1000])
        ids = self.insert(1, (self.rng.choice(GROUPS), extreme))
        if self.rng.random() < 0.5:
            self.delete(ids)
        else:  # updated away: the pre-image carries the extreme
            DeltaTable.forPath(self.spark, self.path).update(
                F.col("id").isin(ids), {"v": F.lit(self.rng.randint(-20, 20))}
            )
            self.commits += 1

    def empty_the_table(self) -> None:
        self.delete(sorted(self.live))

    def burst(self, commits: int = 4) -> None:
        """Several commits (at least ``commits``) mixing every shape above."""
        shapes: list[Callable[[], object]] = [
            self.insert,
            self.insert,
            self.update,
            self.update,
            self.delete,
            self.group_born_and_emptied,
            self.extreme_inserted_and_removed,
        ]
        start = self.commits
        while self.commits - start < commits:
            if self.rng.random() < 0.05 and self.live:
                self.empty_the_table()
            else:
                self.rng.choice(shapes if self.live else [self.insert])()
