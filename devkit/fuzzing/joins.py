"""The join workload of the operation fuzzer: random real Delta operations on every
table of a two- or three-table ``join_view``.

Each table is a fuzzer :class:`~devkit.fuzzing.source.Source` of its own shape
(deletion vectors, column mapping, partitioning), and every operation the fuzzer
makes (key-changing updates, merges, overwrites, restores, re-creations, added
columns, ...) lands on a table drawn at random. After each operation the job runs
a tail of its first table (the engine's own iteration, hand-driven; a snapshot
after its first table was re-created, as a resync does), and its target is
compared whole with the same SQL run by Spark over the tables at the versions
the job records (time travel). The joins are many-to-many (on ``grp``) and, with
three tables, one to one (on ``id``), LEFT then INNER; or, with three tables and
an odd seed, each on its table's key (a fact with its dimensions).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from pyspark.sql import SparkSession

from devkit.fuzzing.source import Op, Shape, Source, draw
from devkit.iterations import HandDriven
from lakeprop.spec import JobKey

DATABASE = "fj"
TWO = (
    "SELECT a.id, a.v, b.v AS bv, b.name AS bname FROM fj.a AS a "
    "LEFT JOIN fj.b AS b ON a.grp = b.grp WHERE a.v % 5 <> 0"
)
THREE = (
    "SELECT a.id, a.v, b.name AS bname, c.v AS cv FROM fj.a AS a "
    "LEFT JOIN fj.b AS b ON a.grp = b.grp JOIN fj.c AS c ON b.id = c.id"
)
THREE_BY_KEY = (
    "SELECT a.id, a.v, b.name AS bname, c.v AS cv FROM fj.a AS a "
    "LEFT JOIN fj.b AS b ON a.grp = b.id JOIN fj.c AS c ON b.id = c.id WHERE a.v % 5 <> 0"
)
"""A fact with its dimensions: every join on the whole key of its table, so the view
holds at most one row per row of ``a`` (the consumer's MERGE on ``a``'s key alone)."""
OUTPUTS = {2: ("id", "v", "bv", "bname"), 3: ("id", "v", "bname", "cv")}


def query_of(seed: int, tables: int) -> str:
    """The seed's query: two tables many to many; three tables many to many (an even
    seed) or each joined on its key (an odd one)."""
    if tables == 2:
        return TWO
    return THREE_BY_KEY if seed % 2 else THREE


class JoinFuzz:
    """One seed: its tables, its job, its operations."""

    def __init__(self, spark: SparkSession, workdir: Path, seed: int, tables: int) -> None:
        self.spark = spark
        self.root = workdir / f"join-{seed}-{tables}"
        self.rng = random.Random(f"join-{seed}")
        self.tables = tables
        names = "abc"[:tables]
        self.sources = {
            name: Source(spark, str(self.root / DATABASE / name), Shape.draw(self.rng))
            for name in names
        }
        query = query_of(seed, tables)
        options = {"query": query, "keys": {name: ["id"] for name in names}}
        self.driver = HandDriven(
            spark,
            str(self.root),
            JobKey(1, DATABASE, "a", "j"),
            {"type": "join_view", "options": options},
        )
        self.query = query
        self.log: list[str] = []

    def run(self, operations: int) -> str | None:
        """Apply ``operations`` random operations; the first difference, or None."""
        try:
            for source in self.sources.values():
                source.create()
                source.apply(draw_insert(self.rng, source))
            self.driver.snapshot(self.sources["a"].version())
            problem = self.compare("snapshot")
            for _ in range(operations):
                if problem is not None:
                    return problem
                name = self.rng.choice(sorted(self.sources))
                source = self.sources[name]
                op = draw(self.rng, source, source.keys(), source.version() + 1)
                before = source.table_id()
                source.apply(op)
                self.log.append(f"{name}: {op}")
                first = self.sources["a"]
                if name == "a" and source.table_id() != before:
                    self.driver.snapshot(first.version())  # the resync of a re-created source
                else:
                    self.driver.tail(first.version())
                problem = self.compare(f"{name}: {op}")
            return problem
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def compare(self, step: str) -> str | None:
        """The target against the query at the recorded versions."""
        assert self.driver.watermark is not None
        versions = {"a": self.driver.watermark}
        for name in self.sources:
            if name != "a":
                mark = self.driver.joined.get(f"{DATABASE}.{name}")
                if mark is None:
                    return f"after {step}: no version of {DATABASE}.{name} recorded"
                versions[name] = mark.version
        for name, version in versions.items():
            self.sources[name].read(version).createOrReplaceTempView(f"fj_{name}")
        query = self.query.replace("fj.a", "fj_a").replace("fj.b", "fj_b").replace("fj.c", "fj_c")
        columns = OUTPUTS[self.tables]
        want = sorted(map(tuple, self.spark.sql(query).select(*columns).collect()), key=str)
        got = sorted(map(tuple, self.driver.read().select(*columns).collect()), key=str)
        if want != got:
            extra = [r for r in got if r not in want][:3]
            missing = [r for r in want if r not in got][:3]
            return (
                f"after {step} at versions {versions}: the target has {extra} beyond the "
                f"query and lacks {missing} ({len(got)} rows against {len(want)})"
            )
        return None


def draw_insert(rng: random.Random, source: Source) -> Op:
    """A first insert of a few rows, so that every table starts with some."""
    return Op("insert", {"rows": source.fresh(rng, rng.randint(3, 6))})


def run_joins(
    spark: SparkSession, workdir: Path, seeds: list[int], operations: int, tables: int
) -> list[tuple[int, str]]:
    """The seeds' failures, each with its operations and first difference."""
    failed = []
    for seed in seeds:
        fuzz = JoinFuzz(spark, workdir, seed, tables)
        problem = fuzz.run(operations)
        if problem is not None:
            failed.append((seed, "; ".join(fuzz.log) + f" -> {problem}"))
    return failed
