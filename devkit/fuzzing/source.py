"""The fuzzer's source table and the real Delta operations it makes on it.

A :class:`Shape` says how the table is made (deletion vectors, column mapping,
partitioning); an :class:`Op` is one operation with its parameters, drawn by
:func:`draw` from a seeded generator and the table's state, so a sequence of
them replays exactly. Keys stay unique in every version: new keys are fresh,
and a key-changing update moves keys only onto keys nobody holds (or, in one
statement, along a chain or a swap, which Delta applies to every row at once).
"""

from __future__ import annotations

import itertools
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakeprop.tables.probe import DeltaLogProbe

WORDS = ("delta", "lake", "merge", "key", "vector", "stream", "table", "change", "feed", "row")
GROUPS = 3
DIMENSION = 4
BASE_COLUMNS = ("id", "grp", "v", "name", "emb")
OPS = (
    "insert",
    "update",
    "update_key",
    "delete",
    "delete_file",
    "merge",
    "overwrite",
    "replace_where",
    "truncate",
    "restore",
    "optimize",
    "add_column",
    "recreate",
)
WEIGHTS = (5, 3, 5, 3, 2, 3, 1, 1, 1, 1, 1, 1, 1)


@dataclass(frozen=True)
class Shape:
    """How a source table is made."""

    deletion_vectors: bool
    column_mapping: str
    """``none``, ``name`` or ``id``."""
    partitioned: bool
    """Partitioned by ``grp``."""

    @classmethod
    def draw(cls, rng: random.Random) -> Shape:
        return cls(rng.random() < 0.5, rng.choice(["none", "name", "id"]), rng.random() < 0.4)

    def properties(self) -> dict[str, str]:
        props = {"delta.enableChangeDataFeed": "true"}
        if self.deletion_vectors:
            props["delta.enableDeletionVectors"] = "true"
        if self.column_mapping != "none":
            props["delta.columnMapping.mode"] = self.column_mapping
        return props


@dataclass(frozen=True)
class Op:
    """One operation and its parameters (plain values: it prints and replays)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.name}({shown})"


def row(rng: random.Random, key: int, extra: tuple[str, ...]) -> dict[str, Any]:
    """A random row with key ``key`` (and values for the columns added since)."""
    name = None if rng.random() < 0.1 else " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
    emb = None if rng.random() < 0.1 else [round(rng.gauss(0, 3), 2) for _ in range(DIMENSION)]
    values: dict[str, Any] = {"id": key, "grp": rng.randrange(GROUPS), "v": rng.randrange(100)}
    values |= {"name": name, "emb": emb}
    for column in extra:
        values[column] = None if rng.random() < 0.3 else f"x{rng.randrange(50)}"
    return values


class Source:
    """The source table of one fuzz sequence."""

    def __init__(self, spark: SparkSession, path: str, shape: Shape) -> None:
        self.spark = spark
        self.path = path
        self.shape = shape
        self.extra: tuple[str, ...] = ()
        """Columns added since the table was made."""
        self.floor = 0
        """The first version of the current table (after a re-create: its versions
        restart) whose schema is today's: RESTORE goes no further back."""
        self.next_key = 0

    @property
    def sql(self) -> str:
        return f"delta.`{self.path}`"

    def create(self) -> None:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in self.shape.properties().items())
        partition = "PARTITIONED BY (grp)" if self.shape.partitioned else ""
        self.spark.sql(
            f"CREATE TABLE {self.sql} (id INT, grp INT, v INT, name STRING, emb ARRAY<FLOAT>) "
            f"USING delta {partition} TBLPROPERTIES ({props})"
        )
        self.extra = ()
        self.floor = 0

    def version(self) -> int:
        version = DeltaLogProbe(self.spark).latest_version(self.path)
        assert version is not None
        return version

    def table_id(self) -> str | None:
        return DeltaLogProbe(self.spark).table_id(self.path)

    def read(self, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.path)

    def keys(self) -> list[int]:
        return sorted(r["id"] for r in self.read().select("id").collect())

    def columns(self) -> tuple[str, ...]:
        return (*BASE_COLUMNS, *self.extra)

    def frame(self, rows: list[dict[str, Any]]) -> DataFrame:
        extra = "".join(f", {c} STRING" for c in self.extra)
        schema = f"id INT, grp INT, v INT, name STRING, emb ARRAY<FLOAT>{extra}"
        return self.spark.createDataFrame(
            [tuple(r[c] for c in self.columns()) for r in rows], schema
        )

    def fresh(self, rng: random.Random, count: int) -> list[dict[str, Any]]:
        rows = [row(rng, self.next_key + i, self.extra) for i in range(count)]
        self.next_key += count
        return rows

    # -- applying an operation ------------------------------------------------------

    def apply(self, op: Op) -> None:
        getattr(self, f"_{op.name}")(**op.params)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        self.frame(rows).write.format("delta").mode("append").save(self.path)

    def _update(self, keys: list[int], delta: int) -> None:
        self.spark.sql(
            f"UPDATE {self.sql} SET v = v + {delta}, name = concat_ws(' ', name, 'upd') "
            f"WHERE id IN ({_ints(keys)})"
        )

    def _update_key(self, moves: dict[int, int]) -> None:
        cases = " ".join(f"WHEN {old} THEN {new}" for old, new in moves.items())
        self.spark.sql(
            f"UPDATE {self.sql} SET id = CASE id {cases} END, v = v + 1 "
            f"WHERE id IN ({_ints(moves)})"
        )

    def _delete(self, keys: list[int]) -> None:
        self.spark.sql(f"DELETE FROM {self.sql} WHERE id IN ({_ints(keys)})")

    def _delete_file(self, first: list[int], rest: list[int]) -> None:
        if first:
            self._delete(first)
        self._delete(rest)

    def files(self) -> list[tuple[list[int], bool]]:
        """Each data file's live keys, and whether rows of it were deleted in place
        (a deletion vector: live rows fewer than the file's highest row index; Delta
        shows ``_metadata.row_index`` only on a table with deletion vectors)."""
        index = F.col("_metadata.row_index") if self.shape.deletion_vectors else F.lit(-1)
        meta = self.read().select(
            "id", F.col("_metadata.file_path").alias("file"), index.alias("i")
        )
        files = meta.groupBy("file").agg(
            F.sort_array(F.collect_list("id")).alias("keys"),
            (F.max("i") + 1 > F.count("*")).alias("vectored"),
        )
        return sorted((list(r["keys"]), bool(r["vectored"])) for r in files.collect())

    def _merge(self, upserts: list[dict[str, Any]], deletes: list[int]) -> None:
        rows = self.frame(upserts).withColumn("_del", F.lit(False))
        if deletes:
            gone = self.read().where(F.col("id").isin(deletes)).withColumn("_del", F.lit(True))
            rows = rows.unionByName(gone)
        rows.createOrReplaceTempView("fuzz_merge_source")
        self.spark.sql(
            f"MERGE INTO {self.sql} t USING fuzz_merge_source s ON t.id = s.id "
            "WHEN MATCHED AND s._del THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET * "
            "WHEN NOT MATCHED AND NOT s._del THEN INSERT *"
        )

    def _overwrite(self, rows: list[dict[str, Any]]) -> None:
        self.frame(rows).write.format("delta").mode("overwrite").save(self.path)

    def _replace_where(self, group: int, rows: list[dict[str, Any]]) -> None:
        writer = self.frame(rows).write.format("delta").mode("overwrite")
        writer.option("replaceWhere", f"grp = {int(group)}").save(self.path)

    def _truncate(self) -> None:
        self.spark.sql(f"DELETE FROM {self.sql}")

    def _restore(self, version: int) -> None:
        self.spark.sql(f"RESTORE TABLE {self.sql} TO VERSION AS OF {int(version)}")

    def _optimize(self, zorder: bool, purge: bool) -> None:
        if purge:
            self.spark.sql(f"REORG TABLE {self.sql} APPLY (PURGE)")
        elif zorder:
            self.spark.sql(f"OPTIMIZE {self.sql} ZORDER BY (v)")
        else:
            self.spark.sql(f"OPTIMIZE {self.sql}")

    def _add_column(self, column: str) -> None:
        self.spark.sql(f"ALTER TABLE {self.sql} ADD COLUMNS ({column} STRING)")
        self.extra = (*self.extra, column)
        self.floor = self.version()

    def _recreate(self) -> None:
        shutil.rmtree(self.path)
        self.create()


def _ints(values: Any) -> str:
    return ", ".join(str(int(v)) for v in values)


Drawer = Callable[[random.Random, "Source", list[int], list[int], int], dict[str, Any]]
"""Draws an operation's parameters from the generator, the source, its keys, a few
of them, and the versions its current table has made."""


def _merge_params(
    rng: random.Random, source: Source, keys: list[int], some: list[int], versions: int
) -> dict[str, Any]:
    kept = [k for k in some if rng.random() < 0.6]
    upserts = [row(rng, k, source.extra) for k in kept] + source.fresh(rng, rng.randint(0, 4))
    return {"upserts": upserts, "deletes": [k for k in some if k not in kept]}


def _delete_file_params(
    rng: random.Random, source: Source, keys: list[int], some: list[int], versions: int
) -> dict[str, Any]:
    """Delete every live row of one file, preferring a file with a deletion vector;
    otherwise (or at random) delete part of it first, so the second delete removes a
    file whose deletion vector the first one wrote (on a source with them)."""
    files = source.files()
    vectored = [k for k, dv in files if dv]
    chosen = rng.choice(vectored or [k for k, _ in files])
    if len(chosen) >= 2 and (not vectored or rng.random() < 0.5):
        first = sorted(rng.sample(chosen, rng.randint(1, len(chosen) - 1)))
        return {"first": first, "rest": [k for k in chosen if k not in first]}
    return {"first": [], "rest": chosen}


def _overwrite_params(
    rng: random.Random, source: Source, keys: list[int], some: list[int], versions: int
) -> dict[str, Any]:
    survivors = [row(rng, k, source.extra) for k in keys if rng.random() < 0.5]
    return {"rows": survivors + source.fresh(rng, rng.randint(0, 5))}


def _replace_where_params(
    rng: random.Random, source: Source, keys: list[int], some: list[int], versions: int
) -> dict[str, Any]:
    group = rng.randrange(GROUPS)
    return {"group": group, "rows": [dict(r, grp=group) for r in source.fresh(rng, 5)]}


DRAWERS: dict[str, Drawer] = {
    "insert": lambda rng, source, keys, some, versions: {
        "rows": source.fresh(rng, rng.randint(1, 8))
    },
    "update": lambda rng, source, keys, some, versions: {
        "keys": some,
        "delta": rng.randint(1, 9),
    },
    "update_key": lambda rng, source, keys, some, versions: {
        "moves": _moves(rng, source, keys, some)
    },
    "delete": lambda rng, source, keys, some, versions: {"keys": some},
    "delete_file": _delete_file_params,
    "merge": _merge_params,
    "overwrite": _overwrite_params,
    "replace_where": _replace_where_params,
    "truncate": lambda rng, source, keys, some, versions: {},
    "restore": lambda rng, source, keys, some, versions: {
        "version": rng.randrange(source.floor, versions - 1)
    },
    "optimize": lambda rng, source, keys, some, versions: {
        "zorder": rng.random() < 0.5,
        "purge": source.shape.deletion_vectors and rng.random() < 0.5,
    },
    "add_column": lambda rng, source, keys, some, versions: {"column": f"c{len(source.extra) + 1}"},
    "recreate": lambda rng, source, keys, some, versions: {},
}
"""Each operation's parameters (:data:`OPS`)."""


def draw(rng: random.Random, source: Source, keys: list[int], versions: int) -> Op:
    """The next operation on ``source``, whose keys are ``keys`` now and whose current
    table has made ``versions`` versions."""
    name = rng.choices(OPS, WEIGHTS)[0]
    some = rng.sample(keys, min(len(keys), rng.randint(1, 6))) if keys else []
    if name in ("update", "update_key", "delete", "delete_file") and not some:
        name = "insert"
    if name == "restore" and versions - 1 <= source.floor:
        name = "optimize"
    return Op(name, DRAWERS[name](rng, source, keys, some, versions))


def _moves(rng: random.Random, source: Source, keys: list[int], moved: list[int]) -> dict[int, int]:
    """New keys for ``moved``: fresh ones, a chain or swap among them, or an old key
    nobody holds any more (a key that changes away and back)."""
    taken = set(keys)
    kind = rng.choice(["fresh", "chain", "swap", "back"])
    if kind == "swap" and len(moved) >= 2:
        a, b = moved[:2]
        return {a: b, b: a}
    if kind == "chain" and len(moved) >= 2:
        chain = dict(itertools.pairwise(moved))
        chain[moved[-1]] = source.next_key
        source.next_key += 1
        return chain
    free = [k for k in range(source.next_key) if k not in taken]
    moves = {}
    for key in moved:
        if kind == "back" and free:
            moves[key] = free.pop(rng.randrange(len(free)))
        else:
            moves[key] = source.next_key
            source.next_key += 1
    return moves
