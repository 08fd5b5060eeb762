"""The native path's pure helpers: Arrow in, Arrow out, and delta-rs tables on a
local disk (no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakeprop.changes import latest_change_per_key_arrow, own_columns
from lakeprop.consumers import native
from lakeprop.engine.model import IterationKind, IterationPlan, Member, MemberJob, TableRef
from lakeprop.engine.native import NativeSettings, why_not
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey, JobSpec
from lakeprop.storage import Storage


def changes(*rows: tuple[int, str, str, int]) -> pa.Table:
    """Change feed rows: (id, name, change type, commit version)."""
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int32()),
            "name": pa.array([r[1] for r in rows]),
            "_change_type": pa.array([r[2] for r in rows]),
            "_commit_version": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def test_a_pre_image_is_a_delete_of_its_key_unless_the_commit_leaves_the_key() -> None:
    """Key-changing updates: the old key goes, also when keys move along a chain in
    one commit, swap, or move away and back over two commits."""
    feed = changes(
        # v2: 1 -> 100 (the old key is only in the pre-image)
        (1, "a", "update_preimage", 2),
        (100, "a", "update_postimage", 2),
        # v3: a chain in one commit, 5 -> 6 -> 7: key 6 is left by the row that was 5
        (5, "e", "update_preimage", 3),
        (6, "e", "update_postimage", 3),
        (6, "f", "update_preimage", 3),
        (7, "f", "update_postimage", 3),
        # v4: 8 <-> 9 swap
        (8, "h", "update_preimage", 4),
        (9, "h", "update_postimage", 4),
        (9, "i", "update_preimage", 4),
        (8, "i", "update_postimage", 4),
        # v5 and v6: 10 -> 11, then 11 -> 10 again
        (10, "j", "update_preimage", 5),
        (11, "j", "update_postimage", 5),
        (11, "j", "update_preimage", 6),
        (10, "j2", "update_postimage", 6),
    )
    latest = latest_change_per_key_arrow(feed, ["id"]).sort_by("id")
    assert [(r["id"], r["name"], r["_change_type"]) for r in latest.to_pylist()] == [
        (1, "a", "delete"),
        (5, "e", "delete"),
        (6, "e", "update_postimage"),
        (7, "f", "update_postimage"),
        (8, "i", "update_postimage"),
        (9, "h", "update_postimage"),
        (10, "j2", "update_postimage"),
        (11, "j", "delete"),
        (100, "a", "update_postimage"),
    ]


def test_the_last_change_per_key_follows_commit_order_and_drops_pre_images() -> None:
    feed = changes(
        (1, "b", "update_postimage", 3),
        (1, "a", "insert", 2),
        (1, "a", "update_preimage", 3),
        (2, "x", "insert", 2),
        (2, "x", "delete", 4),
        # one commit that deletes a key and inserts it again leaves the insert
        (3, "new", "insert", 5),
        (3, "old", "delete", 5),
    )
    latest = latest_change_per_key_arrow(feed, ["id"]).sort_by("id")
    assert latest.to_pylist() == [
        {"id": 1, "name": "b", "_change_type": "update_postimage", "_commit_version": 3},
        {"id": 2, "name": "x", "_change_type": "delete", "_commit_version": 4},
        {"id": 3, "name": "new", "_change_type": "insert", "_commit_version": 5},
    ]


def test_view_types_become_plain_ones_and_a_plain_table_is_left_alone() -> None:
    viewed = pa.table(
        {
            "s": pa.array(["a"], pa.string_view()),
            "nested": pa.array([{"b": "x"}], pa.struct([("b", pa.string_view())])),
        }
    )
    plain = native.plain(viewed)
    assert plain.schema == pa.schema(
        [("s", pa.string()), ("nested", pa.struct([("b", pa.string())]))]
    )
    assert plain.to_pylist() == viewed.to_pylist()
    table = pa.table({"s": ["a"]})
    assert native.plain(table) is table


def test_a_target_lacking_a_written_column_is_a_permanent_error_naming_it(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), pa.table({"id": pa.array([1], pa.int32())}))
    table = DeltaTable(str(tmp_path / "t"))
    native.check_columns(table, ["ID"])  # names resolve as Spark resolves them
    with pytest.raises(native.TargetAlteredError) as raised:
        native.check_columns(table, ["id", "name"])
    assert raised.value.code == ErrorCode.CONSUMER_FAILED
    assert "Cannot resolve column(s) ['name']" in str(raised.value)
    assert "a retry will not fix this" in str(raised.value)


def test_a_table_with_a_feature_delta_rs_does_not_write_stays_on_spark(tmp_path: Path) -> None:
    data = pa.table({"id": pa.array([1], pa.int32())})
    write_deltalake(str(tmp_path / "plain"), data)
    assert native.writable(DeltaTable(str(tmp_path / "plain"))) is None
    write_deltalake(
        str(tmp_path / "dv"), data, configuration={"delta.enableDeletionVectors": "true"}
    )
    assert "deletionVectors" in (native.writable(DeltaTable(str(tmp_path / "dv"))) or "")


def test_an_overwrite_makes_the_table_once_per_version_every_column_nullable(
    tmp_path: Path,
) -> None:
    """A new table gets the rows, nullable columns and its change feed; a replay of
    the version writes nothing; a later version replaces rows and schema."""
    location = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("name", pa.string())])
    rows = pa.table({"id": [1, 2], "name": ["a", None]}, schema=schema)
    native.overwrite(location, rows, Storage(), "job-1", 3, change_feed=True)
    table = DeltaTable(location)
    assert table.transaction_version("job-1") == 3
    assert table.metadata().configuration == {"delta.enableChangeDataFeed": "true"}
    assert all(f.nullable for f in table.schema().fields)
    assert pa.table(table.to_pyarrow_table()).sort_by("id").to_pylist() == rows.to_pylist()

    native.overwrite(location, rows.slice(0, 1), Storage(), "job-1", 3, change_feed=True)
    assert DeltaTable(location).version() == table.version()  # written before: skipped

    later = pa.table({"id": pa.array([7], pa.int64())})
    native.overwrite(location, later, Storage(), "job-1", 5, change_feed=True)
    table = DeltaTable(location)
    assert table.to_pyarrow_table().to_pylist() == [{"id": 7}]
    assert table.transaction_version("job-1") == 5
    assert table.metadata().configuration == {"delta.enableChangeDataFeed": "true"}


OPTIONS: dict[str, dict[str, Any]] = {
    "replica": {"primary_key": ["id"]},
    "secondary_index": {"columns": ["g"], "primary_key": ["id"]},
    "aggregate_view": {"aggregates": [{"fn": "count", "as": "n"}]},
}


def test_a_job_whose_consumers_cannot_all_snapshot_natively_stays_on_spark() -> None:
    def plan(*types: str) -> tuple[IterationPlan, list[MemberJob]]:
        keys = [JobKey(1, "db", "src", f"j{i}") for i in range(len(types))]
        jobs = [
            MemberJob(
                Member((key, i), i, None),
                key,
                JobSpec.from_json({"iteration": {"consumer": {"type": t, "options": OPTIONS[t]}}}),
            )
            for i, (key, t) in enumerate(zip(keys, types, strict=True))
        ]
        members = tuple(j.member for j in jobs)
        return IterationPlan(
            TableRef(1, "db", "src"), IterationKind.SNAPSHOT, 4, members, 0, 0.0
        ), jobs

    assert why_not(*plan("replica", "secondary_index"), NativeSettings()) is None
    assert why_not(*plan("replica", "aggregate_view"), NativeSettings()) == (
        "consumer type(s) ['aggregate_view'] have no native snapshot"
    )
    assert why_not(*plan("replica"), NativeSettings(mode="spark")) == (
        "engine.small_iterations = 'spark'"
    )


def test_every_column_and_array_element_becomes_nullable() -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int32(), nullable=False),
            pa.field("xs", pa.list_(pa.field("x", pa.float32(), nullable=False))),
        ]
    )
    loose = native.nullable(pa.table({"id": [1], "xs": [[1.0]]}, schema=schema)).schema
    assert loose.field("id").nullable and loose.field("xs").nullable
    assert loose.field("xs").type.value_field.nullable


def test_a_snapshot_hands_on_the_columns_a_spark_snapshot_does() -> None:
    """A column named like the change feed's own is left out on both paths."""
    assert own_columns(["id", "_commit_sha", "_change_type", "_x", "v"]) == ("id", "_x", "v")
