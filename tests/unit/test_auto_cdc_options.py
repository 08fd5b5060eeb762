"""auto_cdc options: AUTO CDC's names, their defaults, and every combination rejected."""

from __future__ import annotations

from typing import Any

import pytest

from lakeprop.consumers.auto_cdc.options import (
    DEFAULT_TOMBSTONE_RETENTION,
    CdcOptions,
    source_columns,
    validate,
)
from lakeprop.errors import InvalidConsumerOptionsError

EVENTS = {"keys": ["id"], "sequence_by": "seq"}


def test_an_event_source_gets_its_defaults() -> None:
    options = validate(EVENTS)
    assert options["source_kind"] == "events"
    assert options["sequence_by"] == ["seq"]
    assert options["stored_as_scd_type"] == 1
    assert options["tombstone_retention"] == DEFAULT_TOMBSTONE_RETENTION
    assert (options["ignore_null_updates"], options["quarantine"]) == (False, False)
    assert source_columns(options) == ["id", "seq"]


def test_a_table_source_is_sequenced_by_its_commit_version_unless_asked() -> None:
    assert validate({"keys": ["id"], "source_kind": "table"})["sequence_by"] == ["_commit_version"]
    ts = validate({"keys": ["id"], "source_kind": "table", "sequence_by": "_commit_timestamp"})
    assert ts["sequence_by"] == ["_commit_timestamp", "_commit_version"]
    assert source_columns(ts) == ["id"]


def test_several_sequence_columns_and_history_lists_are_kept_in_order() -> None:
    options = validate(
        {
            **EVENTS,
            "sequence_by": ["epoch", "n"],
            "stored_as_scd_type": "2",
            "track_history_except_column_list": ["note"],
            "tombstone_retention": "1d",
        }
    )
    cdc = CdcOptions.of(options)
    assert cdc.sequence_by == ("epoch", "n") and cdc.scd_type == 2
    assert cdc.tombstone_retention == 86400.0
    assert cdc.target_columns(["id", "epoch", "n", "a", "note", "_commit_version"]) == [
        "epoch",
        "n",
        "a",
        "note",
    ]
    assert cdc.tracked(["epoch", "n", "a", "note"]) == ["epoch", "n", "a"]


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"sequence_by": "seq"}, "keys is required"),
        ({"keys": ["id"]}, "sequence_by is required for an event source"),
        ({**EVENTS, "source_kind": "stream"}, "source_kind must be"),
        ({**EVENTS, "stored_as_scd_type": 3}, "stored_as_scd_type must be 1 or 2"),
        (
            {**EVENTS, "stored_as_scd_type": 2, "apply_as_truncates": "op = 'T'"},
            "apply_as_truncates is for SCD type 1 only",
        ),
        (
            {**EVENTS, "column_list": ["a"], "except_column_list": ["b"]},
            "column_list and except_column_list are mutually exclusive",
        ),
        ({**EVENTS, "track_history_column_list": ["a"]}, "are for SCD type 2 only"),
        (
            {
                **EVENTS,
                "stored_as_scd_type": 2,
                "track_history_column_list": ["a"],
                "track_history_except_column_list": ["b"],
            },
            "track_history_column_list and track_history_except_column_list are mutually",
        ),
        ({**EVENTS, "sequence_by": "id"}, "sequence_by column(s) ['id'] are keys"),
        ({**EVENTS, "except_column_list": ["id"]}, "names key column(s) ['id']"),
        (
            {"keys": ["id"], "source_kind": "table", "apply_as_deletes": "x"},
            "a table source's deletes come from its change feed",
        ),
        ({"keys": ["id"], "source_kind": "table", "sequence_by": "seq"}, "of a table source is"),
        ({**EVENTS, "apply_as_deletes": ""}, "must be a SQL boolean expression"),
        ({**EVENTS, "ignore_null_updates": "yes"}, "ignore_null_updates must be true or false"),
        ({**EVENTS, "tombstone_retention": "forever"}, "tombstone_retention"),
        ({**EVENTS, "keys": ["id; DROP TABLE x"]}, "not a valid identifier"),
        ({**EVENTS, "column_list": ["__SEQUENCE"]}, "reserved"),
        ({**EVENTS, "merge_schema": True}, "unknown option(s) ['merge_schema']"),
    ],
)
def test_a_combination_that_makes_no_sense_is_rejected_with_its_reason(
    options: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidConsumerOptionsError) as raised:
        validate(options)
    assert reason in str(raised.value)
