"""The bounds of a change set's key columns, by which MERGEs skip target files."""

from __future__ import annotations

import datetime
from decimal import Decimal

from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from lakeprop.changes import boundable, bounded_columns, bounds_after
from lakeprop.consumers.fulltext_index import FulltextIndexConsumer
from lakeprop.consumers.replica import ReplicaConsumer
from lakeprop.consumers.secondary_index import SecondaryIndexConsumer
from lakeprop.registry import get_consumer_type


def test_the_bounds_of_a_member_cover_only_the_versions_after_its_start() -> None:
    per_version = {
        2: {"id": (10, 20), "region": ("eu", "us")},
        3: {"id": (5, 12), "region": (None, None)},  # region all NULL in version 3
        4: {"id": (30, 31), "region": ("ap", "ap")},
    }
    assert bounds_after(per_version, 1) == {"id": (5, 31), "region": ("ap", "us")}
    assert bounds_after(per_version, 3) == {"id": (30, 31), "region": ("ap", "ap")}
    assert bounds_after(per_version, 4) == {}
    assert bounds_after({3: {"id": (None, None)}}, 1) == {}


def test_only_types_that_come_back_as_literals_unchanged_get_bounds() -> None:
    kept = [IntegerType(), LongType(), DecimalType(10, 2), DateType(), StringType()]
    left = [DoubleType(), TimestampType(), ArrayType(IntegerType())]
    assert [boundable(t) for t in kept] == [True] * len(kept)
    assert [boundable(t) for t in left] == [False] * len(left)
    assert not boundable(StringType("UNICODE_CI"))  # a collation orders otherwise


def test_key_columns_are_matched_to_the_change_set_ignoring_case_each_once() -> None:
    types = {"ID": IntegerType(), "ts": TimestampType(), "day": DateType()}
    assert bounded_columns(["id", "ts", "Day", "missing", "ID"], types) == ["ID", "day"]


def test_consumer_types_name_the_columns_their_merges_match_by_equality() -> None:
    options = {"primary_key": ["a", "b"], "columns": ["c"]}
    assert ReplicaConsumer.key_columns(options) == ["a", "b"]
    assert SecondaryIndexConsumer.key_columns(options) == ["a", "b"]
    assert FulltextIndexConsumer.key_columns(options) == ["a", "b"]
    # the aggregate view matches its groups NULL-safely: no bounds
    assert get_consumer_type("aggregate_view").key_columns({"group_by": ["g"]}) == []
    assert get_consumer_type("replica").key_columns({"primary_key": ["id"]}) == ["id"]


def test_bounds_keep_python_values_of_the_column_types() -> None:
    day = datetime.date(2026, 1, 2)
    per_version = {1: {"d": (day, day), "m": (Decimal("1.50"), Decimal("2.25"))}}
    assert bounds_after(per_version, 0) == {
        "d": (day, day),
        "m": (Decimal("1.50"), Decimal("2.25")),
    }
