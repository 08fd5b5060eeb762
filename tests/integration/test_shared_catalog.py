"""The shared catalog's layout: partitioned by slot, so instances serving different
slots write different partitions and their MERGEs never conflict; laid out once per
membership era, from a table of an earlier release or another slot count.

Two :class:`JobCatalog` objects stand in for two instances' catalogs (their own
sessions, signed writes, scopes from the slots each holds) on one real Delta table.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from itertools import count
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from devkit.specs import job_row
from lakeprop.errors import InvalidConfigError
from lakeprop.membership.slots import slot_of
from lakeprop.spec import JobKey
from lakeprop.state import store as state
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.catalog_table import LAYOUT_PROPERTY, SLOT, TABLE_SCHEMA, RowScope, SharedWrites
from lakeprop.state.job_row import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.shared import Signed, conflicts_seen

pytestmark = pytest.mark.integration

SLOTS = 4


def shared_catalog(
    spark: SparkSession, path: str, name: str, held: set[int], slots: int = SLOTS
) -> JobCatalog:
    """An instance's view of the catalog: it writes the rows of the slots it holds."""
    versions = count(1)

    def scope(row: CatalogRow) -> RowScope:
        return RowScope.WRITE if slot_of(row.database, row.table, slots) in held else RowScope.SKIP

    shared = SharedWrites(
        scope=scope,
        owner=lambda _row: f"{name}@7",
        sign=lambda: Signed(f"{name}-writer", next(versions)),
    )
    return JobCatalog(spark, path, shared, slots=slots)


def rows_on(slots: set[int], tables: int = 24) -> list[CatalogRow]:
    keys = [JobKey(1, "db", f"t{i}", "copy") for i in range(tables)]
    return [
        job_row(key, job_id=i + 1)
        for i, key in enumerate(keys)
        if slot_of(key.database, key.table, SLOTS) in slots
    ]


def stored(spark: SparkSession, path: str) -> dict[tuple[str, str], tuple[int | None, int]]:
    """(database, table) -> (watermark, slot) as the table holds them."""
    return {
        (r["database"], r["table"]): (r["watermark"], r[SLOT])
        for r in state.read_table(spark, path).collect()
    }


def test_instances_of_different_slots_write_the_catalog_at_once_without_a_conflict(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "catalog")
    a = shared_catalog(spark, path, "a", {0, 1})
    b = shared_catalog(spark, path, "b", {2, 3})
    for catalog in (a, b):
        catalog.ensure()
        catalog.load()
        catalog.era("topic")
    mine = {a: rows_on({0, 1}), b: rows_on({2, 3})}
    assert all(mine.values())
    before = conflicts_seen().get("catalog", 0)

    def write(catalog: JobCatalog) -> None:
        for watermark in range(1, 9):  # eight commits each, back to back, both at once
            rows = [replace(r, watermark=watermark) for r in mine[catalog]]
            catalog.commit({r.row_id: r for r in rows})

    threads = [threading.Thread(target=write, args=(c,)) for c in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert conflicts_seen().get("catalog", 0) == before
    assert stored(spark, path) == {
        (r.database, r.table): (8, slot_of(r.database, r.table, SLOTS))
        for rows in mine.values()
        for r in rows
    }


def test_a_catalog_of_an_earlier_release_and_a_new_slot_count_are_laid_out_once_per_era(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "catalog")
    rows = rows_on({0, 1, 2, 3})
    # an earlier release's table: not partitioned, no slot column
    state.ensure_table(spark, path, CATALOG_SCHEMA)
    state.overwrite(spark, path, CATALOG_SCHEMA, [r.as_tuple() for r in rows])

    # one instance lays it out for one slot, and keeps the rows
    alone = JobCatalog(spark, path)
    alone.ensure()
    alone.load()
    assert alone.layout == 1
    assert set(alone.by_id()) == {r.row_id for r in rows}
    assert set(stored(spark, path).values()) == {(None, 0)}

    # two instances on a new membership topic: laid out for its slot count, once
    first = shared_catalog(spark, path, "a", {0, 1})
    second = shared_catalog(spark, path, "b", {2, 3})
    for catalog in (first, second):
        catalog.ensure()
        catalog.load()
    version = state_version(spark, path)
    first.era("topic-1")
    laid_out = state_version(spark, path)
    second.era("topic-1")  # the same era: the table holds its layout, nothing rewritten
    assert state_version(spark, path) == laid_out > version
    assert {k: s for k, (_, s) in stored(spark, path).items()} == {
        (r.database, r.table): slot_of(r.database, r.table, SLOTS) for r in rows
    }
    assert properties(spark, path)[LAYOUT_PROPERTY] == str(SLOTS)

    # another slot count on the same topic cannot be laid out: a clear error
    wrong = shared_catalog(spark, path, "c", {0}, slots=6)
    wrong.ensure()
    wrong.load()
    with pytest.raises(InvalidConfigError, match=r"new slot count needs a new cluster\.topic"):
        wrong.era("topic-1")

    # one instance again keeps the cluster's layout
    again = JobCatalog(spark, path)
    again.ensure()
    again.load()
    assert again.layout == SLOTS
    assert [f.name for f in state.read_table(spark, path).schema.fields] == TABLE_SCHEMA.names


def state_version(spark: SparkSession, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).first()["version"])  # type: ignore[index]


def properties(spark: SparkSession, path: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail is not None
    return dict(detail["properties"])
