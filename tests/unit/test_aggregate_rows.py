"""An aggregate view's arithmetic on its native path, in plain Python (no Spark)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from deltalake.schema import ArrayType, PrimitiveType

from lakeprop.consumers.aggregate_rows import Shape, deltas, extremes_of, moved
from lakeprop.consumers.aggregate_view import columns_refused, fold_extremes

SHAPE = Shape(
    ("g",),
    (
        {"fn": "count", "column": None, "as": "n"},
        {"fn": "count", "column": "v", "as": "counted"},
        {"fn": "sum", "column": "v", "as": "total"},
        {"fn": "avg", "column": "v", "as": "mean"},
        {"fn": "min", "column": "v", "as": "low"},
        {"fn": "max", "column": "v", "as": "high"},
    ),
)


def change(kind: str, g: Any, v: Any) -> dict[str, Any]:
    return {"_change_type": kind, "g": g, "v": v}


def view_row(g: Any, rows: int, total: int, counted: int, low: Any, high: Any) -> dict[str, Any]:
    return {
        "g": g,
        "_lp_rows": rows,
        "_lp_sum_counted": total,
        "_lp_n_counted": counted,
        "_lp_sum_total": total,
        "_lp_n_total": counted,
        "_lp_sum_mean": total,
        "_lp_n_mean": counted,
        "low": low,
        "high": high,
    }


def test_a_groups_rows_counts_and_sums_move_by_the_signed_change_rows() -> None:
    moved_by = deltas(
        SHAPE,
        [
            change("insert", "a", 5),
            change("insert", None, 7),  # NULL is a group of its own, as in SQL
            change("update_preimage", "a", 2),
            change("update_postimage", "a", 3),
            change("insert", "a", None),  # counted as a row, not as a value
            change("delete", None, 7),
        ],
    )
    assert set(moved_by) == {("a",), (None,)}
    row, recompute = moved(SHAPE, ("a",), moved_by[("a",)], view_row("a", 2, 6, 2, 2, 4))
    assert recompute  # the old minimum (2) was updated away: the source decides it
    assert row == {
        "g": "a",
        "_lp_rows": 4,
        "_lp_sum_counted": 12,
        "_lp_n_counted": 3,
        "_lp_sum_total": 12,
        "_lp_n_total": 3,
        "_lp_sum_mean": 12,
        "_lp_n_mean": 3,
        "low": 2,
        "high": 5,
        "n": 4,
        "counted": 3,
        "total": 12,
        "mean": 4.0,
    }
    source = [{"g": "a", "v": v} for v in (4, 5, 3, None)] + [{"g": "b", "v": 1}]
    assert extremes_of(SHAPE, source, [("a",), ("c",)]) == {
        ("a",): {"low": 3, "high": 5},
        ("c",): {"low": None, "high": None},
    }
    # the NULL group came and went in the range: no rows, no values
    gone, _ = moved(SHAPE, (None,), moved_by[(None,)], None)
    assert (gone["g"], gone["_lp_rows"], gone["n"], gone["total"], gone["mean"]) == (
        None,
        0,
        0,
        None,
        None,
    )


def test_an_extreme_is_recomputed_only_when_a_value_at_or_beyond_it_went() -> None:
    current = view_row("a", 3, 9, 3, 1, 5)  # values 1, 3, 5
    inside = deltas(SHAPE, [change("delete", "a", 3), change("insert", "a", 4)])
    row, recompute = moved(SHAPE, ("a",), inside[("a",)], current)
    assert (recompute, row["low"], row["high"], row["total"]) == (False, 1, 5, 10)
    at_max = deltas(SHAPE, [change("update_preimage", "a", 5), change("update_postimage", "a", 6)])
    row, recompute = moved(SHAPE, ("a",), at_max[("a",)], current)
    assert (recompute, row["high"]) == (False, 6)  # a larger value took its place
    lowered = deltas(SHAPE, [change("update_preimage", "a", 5), change("update_postimage", "a", 2)])
    assert moved(SHAPE, ("a",), lowered[("a",)], current)[1]  # 5 went, nothing as large came
    # inserted and removed again inside the range, beyond the view's extreme
    passing = deltas(SHAPE, [change("insert", "a", 9), change("delete", "a", 9)])
    assert moved(SHAPE, ("a",), passing[("a",)], current)[1]


def test_without_group_by_the_view_is_one_group_over_every_row() -> None:
    whole = Shape((), SHAPE.aggregates)
    moved_by = deltas(whole, [change("insert", "a", 2), change("insert", "b", 3)])
    assert set(moved_by) == {()}
    row, recompute = moved(whole, (), moved_by[()], None)
    assert not recompute
    assert (row["n"], row["total"], row["mean"], row["low"], row["high"]) == (2, 5, 2.5, 2, 3)


def test_the_fold_of_a_recompute_groups_nulls_together_whatever_the_columns_are_called() -> None:
    """Arrow names an aggregate ``<column>_<fn>``: a group column called so too does
    not take its place."""
    rows = pa.table({"v_max": ["a", None, "a", None, "b"], "v": [1, 5, 3, None, 2]})
    extremes = [
        {"fn": "max", "column": "v", "as": "high"},
        {"fn": "min", "column": "v", "as": "low"},
    ]
    folded = fold_extremes(rows, ["v_max"], extremes)
    assert sorted(folded, key=lambda r: str(r["v_max"])) == [
        {"v_max": None, "high": 5, "low": 5},
        {"v_max": "a", "high": 3, "low": 1},
        {"v_max": "b", "high": 2, "low": 2},
    ]
    assert fold_extremes(rows, [], extremes) == [{"high": 5, "low": 1}]


@pytest.mark.parametrize(
    ("used", "refusal"),
    [
        ([("g", "group"), ("v", "sum"), ("v", "max")], None),
        ([("f", "group")], "group column f is of type double"),
        ([("d", "avg")], "avg(d) of type decimal(10,2) is typed by Spark's rules"),
        ([("g", "count")], "count(g) of type string is typed by Spark's rules"),
        ([("f", "min")], "min(f) of type double orders NaN as Spark does"),
        ([("G", "group")], "column 'G' is named otherwise in the source"),
        ([("tags", "group")], "column tags is of a nested type"),
        ([("g", "max"), ("d", "min"), ("f", "sum")], None),
    ],
)
def test_columns_python_would_read_otherwise_than_spark_keep_a_view_on_spark(
    used: list[tuple[str, str]], refusal: str | None
) -> None:
    kinds = {
        "g": PrimitiveType("string"),
        "v": PrimitiveType("integer"),
        "f": PrimitiveType("double"),
        "d": PrimitiveType("decimal(10,2)"),
        "tags": ArrayType(PrimitiveType("string")),
    }
    assert columns_refused(used, kinds) == refusal
