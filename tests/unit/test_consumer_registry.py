"""Resolving consumer types: built-ins, import paths, entry points (no Spark)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lakeprop.consumers import UnknownConsumerError, get_consumer_type
from lakeprop.spec import JobSpec

AUDIT = "tests.integration.custom_consumers:AuditConsumer"


def test_built_in_types() -> None:
    assert get_consumer_type("replica").name == "replica"
    index = get_consumer_type("secondary_index")
    options = index.validate_options({"columns": ["customer"], "primary_key": ["id"]})
    assert index.source_columns(options) == ["customer", "id"]


def test_a_consumer_class_by_import_path() -> None:
    spec = JobSpec.from_json(
        {"iteration": {"consumer": {"type": AUDIT, "options": {"primary_key": ["id"]}}}}
    )
    assert spec.iteration.consumer.options == {"primary_key": ["id"], "target_table": None}
    assert get_consumer_type(AUDIT).source_columns({"primary_key": ["id"]}) == ["id"]


def test_a_consumer_by_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "acme_consumers-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-consumers\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[lakeprop.consumers]\nacme_audit = {AUDIT}\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    consumer_type = get_consumer_type("acme_audit")
    assert consumer_type.name == "acme_audit"
    assert consumer_type.factory.__name__ == "AuditConsumer"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("nope", "unknown consumer type 'nope'"),
        ("os.path:join", "neither a Consumer subclass nor a ConsumerType"),
        ("no_such_module_xyz:Thing", "cannot load consumer"),
        ("tests.integration.custom_consumers:Missing", "has no attribute 'Missing'"),
        ("bad path:X", "not an import path"),
        (5, "must be a string"),
    ],
)
def test_unresolvable_types_are_explained(name: object, words: str) -> None:
    with pytest.raises(UnknownConsumerError) as info:
        get_consumer_type(name)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("type_name", "options", "words"),
    [
        ("secondary_index", {"primary_key": ["id"]}, "columns is required"),
        ("secondary_index", {"columns": ["a"], "primary_key": ["id"], "x": 1}, "unknown option"),
        ("secondary_index", {"columns": ["a;b"], "primary_key": ["id"]}, "not a valid identifier"),
        ("kafka_changefeed", {"topic": "t", "primary_key": ["id"]}, "bootstrap_servers"),
        (
            "kafka_changefeed",
            {"topic": "bad topic!", "bootstrap_servers": "h:1", "primary_key": ["id"]},
            "Kafka topic name",
        ),
        ("kafka_changefeed", {"topic": "t", "bootstrap_servers": "h:1"}, "primary_key"),
        ("aggregate_view", {"group_by": ["g"]}, "aggregates must be a non-empty list"),
        (
            "aggregate_view",
            {"aggregates": [{"fn": "median", "column": "x", "as": "m"}]},
            "fn must be one of",
        ),
        ("aggregate_view", {"aggregates": [{"fn": "sum", "as": "s"}]}, "sum needs a column"),
        ("aggregate_view", {"aggregates": [{"fn": "count", "as": "_lp_rows"}]}, "reserved"),
        (
            "aggregate_view",
            {"group_by": ["n"], "aggregates": [{"fn": "count", "as": "n"}]},
            "must be distinct",
        ),
    ],
)
def test_bad_consumer_options_are_explained(type_name: str, options: dict, words: str) -> None:
    from lakeprop.consumers import InvalidConsumerOptionsError

    with pytest.raises(InvalidConsumerOptionsError) as info:
        get_consumer_type(type_name).validate_options(options)
    assert words in str(info.value)
