"""The native ``kafka_changefeed`` messages: Spark's JSON, ops and order, without Spark.

The expected strings are what Spark 4's ``to_json`` wrote for the same values
(session time zone UTC), and what the Spark path derives for each kind of change."""

from __future__ import annotations

import json
import os
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake.schema import ArrayType, MapType, PrimitiveType

from lakeprop.consumers.feed_messages import (
    Encoder,
    java_double,
    java_float,
    messages,
    operations,
    quote,
    snapshot_messages,
    unsupported,
    unsupported_settings,
)
from lakeprop.tables.probe import DeltaLogProbe

DOUBLES = {
    1.0: "1.0",
    1e10: "1.0E10",
    0.1: "0.1",
    1e-7: "1.0E-7",
    1.2345678901234568e17: "1.2345678901234568E17",
    100.0: "100.0",
    1e21: "1.0E21",
    1e20: "1.0E20",
    12345678.9: "1.23456789E7",
    0.001: "0.001",
    0.0001: "1.0E-4",
    -2.5: "-2.5",
    9999999.0: "9999999.0",
    1234.5678: "1234.5678",
    0.0: "0.0",
}


@pytest.mark.parametrize(("value", "written"), DOUBLES.items())
def test_doubles_are_written_as_java_writes_them(value: float, written: str) -> None:
    assert java_double(value) == written
    assert float(written) == value


def test_floats_are_written_in_their_shortest_single_precision_form() -> None:
    assert java_float(0.1) == "0.1"  # not 0.10000000149011612, the double it widens to
    assert java_float(1e10) == "1.0E10"
    assert java_float(-3.25) == "-3.25"
    assert java_float(float("nan")) == "NaN"


KINDS = {
    "i": "long",
    "b": "boolean",
    "str": "string",
    "d2": "double",
    "dn": "double",
    "di": "double",
    "f1": "float",
    "nul": "string",
    "dt": "date",
    "ts": "timestamp",
    "dec": "decimal",
    "arr": "array<long>",
    "emb": "array<float>",
}


def test_a_row_is_the_json_spark_writes_for_it() -> None:
    row: dict[str, Any] = {
        "i": 1,
        "b": True,
        "str": 'a"bé\n',
        "d2": 1e10,
        "dn": float("nan"),
        "di": float("inf"),
        "f1": 0.10000000149011612,
        "nul": None,
        "dt": date(2026, 1, 2),
        "ts": datetime(2026, 1, 2, 3, 4, 5, 123456),
        "dec": Decimal("1.50"),
        "arr": [1, 2],
        "emb": [0.5, None, 0.10000000149011612],
    }
    written = Encoder(KINDS, "UTC").struct(list(row), row)
    assert written == (
        '{"i":1,"b":true,"str":"a\\"bé\\n","d2":1.0E10,"dn":"NaN","di":"Infinity",'
        '"f1":0.1,"dt":"2026-01-02","ts":"2026-01-02T03:04:05.123Z","dec":1.50,'
        '"arr":[1,2],"emb":[0.5,null,0.1]}'
    )
    assert json.loads(written)["str"] == row["str"]


def test_timestamps_are_in_the_session_time_zone() -> None:
    encoder = Encoder({"ts": "timestamp"}, "Europe/Paris")
    moment = datetime(2026, 7, 1, 10, 0, 0, 5000)  # a UTC instant, as Arrow gives it
    assert encoder.timestamp(moment) == "2026-07-01T12:00:00.005+02:00"
    assert encoder.commit_timestamp(moment) == "2026-07-01 12:00:00.005"
    assert Encoder({}, "UTC").commit_timestamp(datetime(2026, 1, 2, 3, 4, 5)) == (
        "2026-01-02 03:04:05"
    )


def change(kind: str, version: int, **row: Any) -> dict[str, Any]:
    return {**row, "_change_type": kind, "_commit_version": version, "_commit_timestamp": None}


def test_each_change_gets_the_op_the_spark_path_gives_it() -> None:
    rows = [
        change("insert", 2, id=1, v="a"),
        change("update_preimage", 3, id=1, v="a"),  # an update keeping its key
        change("update_postimage", 3, id=1, v="b"),
        change("update_preimage", 4, id=1, v="b"),  # an update moving 1 to 2
        change("update_postimage", 4, id=2, v="b"),
        change("delete", 5, id=2, v="b"),
    ]
    assert operations(rows, ["id"]) == ["insert", None, "update", "delete", "insert", "delete"]


def test_each_keys_messages_are_in_version_order_a_delete_first() -> None:
    rows = [
        change("update_postimage", 4, id=2, v="new"),  # 1 moved onto key 2 ...
        change("delete", 4, id=2, v="old"),  # ... whose row went in the same commit
        change("update_preimage", 4, id=1, v="x"),
        change("insert", 3, id=2, v="old"),
    ]
    encoder = Encoder({"id": "long", "v": "string"}, "UTC")
    sent = [(k, json.loads(v)) for k, v in messages(rows, ["id"], encoder)]
    assert [(k, m["op"], m["version"], m["row"]["v"]) for k, m in sent] == [
        ('{"id":1}', "delete", 4, "x"),
        ('{"id":2}', "insert", 3, "old"),
        ('{"id":2}', "delete", 4, "old"),
        ('{"id":2}', "insert", 4, "new"),
    ]
    assert all("commit_timestamp" not in m for _, m in sent)  # a null field is left out


def test_a_snapshot_is_each_row_at_its_version_with_no_commit_timestamp() -> None:
    rows = [{"id": 2, "v": None, "_hidden": 1}, {"id": 1, "v": "a", "_hidden": 2}]
    encoder = Encoder({"id": "long", "v": "string", "_hidden": "long"}, "UTC")
    assert snapshot_messages(rows, ["id"], 7, encoder) == [
        ('{"id":1}', '{"op":"snapshot","version":7,"row":{"id":1,"v":"a"}}'),
        ('{"id":2}', '{"op":"snapshot","version":7,"row":{"id":2}}'),
    ]


def test_types_spark_alone_writes_keep_the_job_on_spark() -> None:
    supported = [
        ("id", PrimitiveType("integer")),
        ("amount", PrimitiveType("decimal(10,2)")),
        ("at", PrimitiveType("timestamp")),
        ("emb", ArrayType(PrimitiveType("float"))),
        ("_hidden", PrimitiveType("binary")),  # not published
    ]
    assert unsupported(supported, ["id"]) is None
    for name, data_type in [
        ("raw", PrimitiveType("binary")),
        ("local", PrimitiveType("timestamp_ntz")),
        ("tags", MapType(PrimitiveType("string"), PrimitiveType("integer"))),
        ("grid", ArrayType(ArrayType(PrimitiveType("integer")))),
    ]:
        reason = unsupported([*supported, (name, data_type)], ["id"])
        assert reason is not None and reason.startswith(f"column {name} of type"), reason
    # the key is written whatever its name: a binary key column starting with _ too
    assert "column _hidden" in (unsupported(supported, ["id", "_hidden"]) or "")
    for key, why in [
        (["ID"], "named differently"),  # Spark resolves it, whatever its case
        (["emb"], "of kind array<float>"),
        (["amount_d"], "of kind double"),  # Spark groups a key's NaN as one value
    ]:
        fields = [*supported, ("amount_d", PrimitiveType("double"))]
        assert why in (unsupported(fields, key) or ""), key


def test_settings_that_change_sparks_json_keep_the_job_on_spark() -> None:
    defaults: dict[str, str] = {}
    conf = lambda name, default: defaults.get(name, default)  # noqa: E731
    assert unsupported_settings("UTC", conf) is None
    assert unsupported_settings("Europe/Paris", conf) is None
    assert "time zone" in (unsupported_settings("GMT+1", conf) or "")
    defaults["spark.sql.jsonGenerator.ignoreNullFields"] = "false"
    assert "ignoreNullFields" in (unsupported_settings("UTC", conf) or "")


def test_strings_escape_control_characters_as_jackson_does() -> None:
    text = 'a"b\\c\n\x0b\x1f\u00e9\U0001f600'
    written = quote(text)
    assert written == '"a\\"b\\\\c\\n\\u000B\\u001F\u00e9\U0001f600"'
    assert json.loads(written) == text


def test_early_years_and_offsets_with_seconds_are_written_as_spark_writes_them() -> None:
    assert Encoder({}, "UTC").timestamp(datetime(5, 1, 2, 3, 4, 5)) == "0005-01-02T03:04:05.000Z"
    # Amsterdam kept +00:19:32 until 1937: Spark 4 writes an offset's seconds
    amsterdam = Encoder({}, "Europe/Amsterdam").timestamp(datetime(1930, 1, 1, 12, 0, 0))
    assert amsterdam.endswith("+00:19:32"), amsterdam


def test_floating_point_values_are_written_by_the_given_formatter_once_a_kind() -> None:
    calls: list[tuple[str, list[float]]] = []

    def jvm(kind: str, values: list[float]) -> list[str]:
        calls.append((kind, values))
        return [f"<{kind}:{v}>" for v in values]

    encoder = Encoder({"d": "double", "e": "array<float>"}, "UTC", jvm)
    rows = [{"d": 1.5, "e": [0.5, None]}, {"d": 1.5, "e": [2.0]}, {"d": None, "e": None}]
    encoder.prepare(rows)
    assert sorted(k for k, _ in calls) == ["double", "float"]
    assert encoder.struct(["d", "e"], rows[0]) == '{"d":<double:1.5>,"e":[<float:0.5>,null]}'


def test_change_feed_times_are_the_commit_files_times_kept_increasing(tmp_path: Path) -> None:
    """As Delta's change feed gives them: a commit file's modification time, or its
    in-commit timestamp; each above the one before, from commits before the range too."""
    log = tmp_path / "_delta_log"
    log.mkdir()
    at = {0: 5_000, 1: 5_000, 2: 5_000, 3: 4_000, 4: 9_000}  # ms: ties and a step back
    for version, ms in at.items():
        commit = log / f"{version:020d}.json"
        commit.write_text('{"commitInfo":{"timestamp":1}}\n')
        os.utime(commit, ns=(ms * 1_000_000, ms * 1_000_000))
    (log / f"{5:020d}.json").write_text(
        '{"commitInfo":{"timestamp":1,"inCommitTimestamp":12345}}\n'
    )
    probe = DeltaLogProbe(None)  # type: ignore[arg-type]  # a local log: no session
    assert probe.change_feed_times(str(tmp_path), 2, 5) == {2: 5_002, 3: 5_003, 4: 9_000, 5: 12_345}
    assert probe.change_feed_times(str(tmp_path), 5, 6) is None  # commit 6 is not there
