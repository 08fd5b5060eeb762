"""Every class of bad change log input lands in the rejects table; valid ones apply."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from devkit.harness import catalog_df, make_source, run_once, table
from devkit.kafka import produce_raw
from lakeprop.config import AppConfig, EngineConfig
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey
from lakeprop.state.outcomes import REJECTS_SCHEMA

pytestmark = pytest.mark.integration


@pytest.fixture
def app_config(app_config: AppConfig) -> AppConfig:
    """The change log and catalog alone: no iterations run in these tests."""
    return replace(app_config, engine=EngineConfig(enabled=False))


VALID_SPEC = {
    "trigger": {"kind": "greedy"},
    "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
}


def message(n: int, **changes: Any) -> tuple[bytes, bytes]:
    body: dict[str, Any] = {
        "version": 1,
        "op": "register",
        "request_id": f"req-{n}",
        "job": {"account_id": 1, "database": "sales", "table": "orders", "name": f"job_{n}"},
        "spec": VALID_SPEC,
    }
    body.update(changes)
    job = body["job"]
    key = f"{job.get('account_id')}/{job.get('database')}/{job.get('table')}/{job.get('name')}"
    return key.encode(), json.dumps(body).encode()


def with_spec(n: int, spec: dict[str, Any]) -> tuple[bytes, bytes]:
    return message(n, spec=spec)


def consumer_spec(consumer: dict[str, Any]) -> dict[str, Any]:
    return {"trigger": {"kind": "default"}, "iteration": {"consumer": consumer}}


# (message, expected error code, words the reason must contain)
CASES: list[tuple[tuple[bytes | None, bytes | None], ErrorCode, str]] = [
    ((b"1/sales/orders/x", b"{not json"), ErrorCode.INVALID_MESSAGE, "not valid JSON"),
    ((b"k", b"\xff\xfe\x00"), ErrorCode.INVALID_MESSAGE, "not UTF-8"),
    ((b"k", b"[1, 2]"), ErrorCode.INVALID_MESSAGE, "must be a JSON object"),
    (message(3, version=2), ErrorCode.UNSUPPORTED_VERSION, "unsupported envelope version 2"),
    (message(4, op="drop_everything"), ErrorCode.UNKNOWN_OPERATION, "unknown operation"),
    (message(5, request_id=None), ErrorCode.INVALID_MESSAGE, "request_id"),
    (
        message(
            6, job={"account_id": "seven", "database": "sales", "table": "orders", "name": "j"}
        ),
        ErrorCode.INVALID_SPEC,
        "account_id must be an integer",
    ),
    (
        message(7, job={"account_id": 1, "database": "sales", "name": "j"}),
        ErrorCode.INVALID_SPEC,
        "missing field(s) ['table']",
    ),
    (
        with_spec(8, {"trigger": {"kind": "periodic"}, "iteration": VALID_SPEC["iteration"]}),
        ErrorCode.INVALID_SPEC,
        "trigger.interval is required",
    ),
    (
        with_spec(9, {"trigger": {"kind": "sometimes"}, "iteration": VALID_SPEC["iteration"]}),
        ErrorCode.INVALID_SPEC,
        "trigger.kind must be one of",
    ),
    (
        with_spec(10, consumer_spec({"type": "vector_magic"})),
        ErrorCode.UNKNOWN_CONSUMER,
        "unknown consumer type 'vector_magic'",
    ),
    (
        with_spec(11, consumer_spec({"type": "replica", "options": {}})),
        ErrorCode.INVALID_CONSUMER_OPTIONS,
        "primary_key is required",
    ),
    (
        message(
            12,
            job={
                "account_id": 1,
                "database": "sales",
                "table": "orders`; DROP TABLE x; --",
                "name": "j",
            },
        ),
        ErrorCode.INVALID_IDENTIFIER,
        "is not a valid identifier",
    ),
    (
        message(
            13, job={"account_id": 1, "database": "sales", "table": "plain_parquet", "name": "j"}
        ),
        ErrorCode.SOURCE_NOT_DELTA,
        "is not a Delta table",
    ),
    (
        message(14, job={"account_id": 1, "database": "sales", "table": "missing", "name": "j"}),
        ErrorCode.SOURCE_NOT_DELTA,
        "does not exist",
    ),
    (
        with_spec(15, consumer_spec({"type": "replica", "options": {"primary_key": ["nope"]}})),
        ErrorCode.SOURCE_COLUMN_MISSING,
        "has no column(s) ['nope']",
    ),
    (
        (b"1/sales/orders/other", message(16)[1]),
        ErrorCode.INVALID_MESSAGE,
        "does not match the job key",
    ),
    ((b"k", None), ErrorCode.INVALID_MESSAGE, "has no value"),
]


def test_each_class_of_bad_input_is_rejected_with_a_reason_and_valid_ones_apply(
    spark: SparkSession, app_config: AppConfig
) -> None:
    make_source(spark, app_config, "sales", "orders")
    spark.range(3).write.mode("overwrite").parquet(
        f"{app_config.tables.warehouse}/sales/plain_parquet"
    )
    valid_before = message(100)
    valid_after = message(101)
    messages = [valid_before] + [m for m, _, _ in CASES] + [valid_after]
    coordinates = produce_raw(app_config.kafka.bootstrap_servers, app_config.kafka.topic, messages)

    run_once(spark, app_config)

    rejects = table(spark, app_config, "rejects")
    expected = spark.createDataFrame(
        [
            (app_config.kafka.topic, coordinates[i + 1][0], coordinates[i + 1][1], code.value)
            for i, (_, code, _) in enumerate(CASES)
        ],
        "topic STRING, partition INT, offset LONG, error_code INT",
    )
    assert_df_equality(
        rejects.select("topic", "partition", "offset", "error_code"),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    reasons = {r["offset"]: r["reason"] for r in rejects.collect()}
    for i, (_, _, words) in enumerate(CASES):
        assert words in reasons[coordinates[i + 1][1]], (i, reasons[coordinates[i + 1][1]])
    payloads = {r["offset"]: r["payload"] for r in rejects.collect()}
    assert [payloads[coordinates[i + 1][1]] for i in range(len(CASES))] == [
        None if m[1] is None else bytearray(m[1]) for m, _, _ in CASES
    ]
    assert rejects.schema == REJECTS_SCHEMA

    jobs = catalog_df(spark, app_config).select("account_id", "database", "table", "job_name")
    assert sorted(tuple(r) for r in jobs.collect()) == [
        (1, "sales", "orders", "job_100"),
        (1, "sales", "orders", "job_101"),
    ]
    # requests that could be identified are answered too
    outcomes = {
        r["request_id"]: r["outcome"] for r in table(spark, app_config, "requests").collect()
    }
    assert outcomes["req-100"] == outcomes["req-101"] == "applied"
    assert outcomes["req-10"] == outcomes["req-13"] == "rejected"


def test_an_update_that_breaks_the_spec_is_rejected_and_the_job_keeps_its_spec(
    spark: SparkSession, app_config: AppConfig
) -> None:
    make_source(spark, app_config, "sales", "orders")
    key = JobKey(1, "sales", "orders", "job_1")
    register = message(1)
    bad_update = (
        key.message_key,
        json.dumps(
            {
                "version": 1,
                "op": "update_spec",
                "request_id": "upd",
                "job": key.to_json(),
                "spec": {"trigger": {"kind": "periodic"}},
            }
        ).encode(),
    )
    bad_columns = (
        key.message_key,
        json.dumps(
            {
                "version": 1,
                "op": "update_spec",
                "request_id": "upd2",
                "job": key.to_json(),
                "spec": {"iteration": {"consumer": {"options": {"columns": ["id", "ghost"]}}}},
            }
        ).encode(),
    )
    produce_raw(
        app_config.kafka.bootstrap_servers,
        app_config.kafka.topic,
        [register, bad_update, bad_columns],
    )
    run_once(spark, app_config)

    spec = json.loads(catalog_df(spark, app_config).first()["job_spec"])
    assert spec["trigger"] == {"kind": "greedy"}
    assert spec["iteration"]["consumer"]["options"]["columns"] is None
    reasons = sorted(r["reason"] for r in table(spark, app_config, "rejects").collect())
    assert "trigger.interval is required for a periodic trigger" in reasons[1]
    assert "has no column(s) ['ghost']" in reasons[0]


NASTY = [
    "x'; DROP TABLE orders; --",
    'a"b',
    "`tick`",
    "naïve",
    "名前",
    "",
    " ",
    "a b",
    "x" * 300,
    "1st",
    "a.b",
    "\x00",
    "emoji😀",
]
WRONG_TYPES: list[Any] = [None, 7, -1.5, True, [], ["a"], {}, {"a": 1}, "s"]


def fuzzed(rng: random.Random, n: int, oversize: int) -> tuple[bytes | None, bytes | None]:
    """One change log message that must be rejected: broken in one random way."""
    key, value = message(n)
    body = json.loads(value)
    kind = rng.randrange(9)
    if kind == 0:  # random bytes
        return key, bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if kind == 1:  # truncated JSON
        return key, value[: rng.randint(0, len(value) - 2)]
    if kind == 2:  # oversized
        body["request_id"] = f"big-{n}"
        body["padding"] = "x" * oversize
    elif kind == 3:  # a bad identifier in the job key
        body["job"][rng.choice(["database", "table", "name"])] = rng.choice(NASTY)
    elif kind == 4:  # a wrongly typed envelope field
        field = rng.choice(["version", "op", "job", "spec"])
        body[field] = rng.choice([v for v in WRONG_TYPES if v != body[field]])
    elif kind == 5:  # a wrongly typed job field
        field = rng.choice(["account_id", "database", "table", "name"])
        body["job"][field] = rng.choice(
            [v for v in WRONG_TYPES if not isinstance(v, str) or field == "account_id"]
        )
    elif kind == 6:  # a bad consumer: unknown type, nasty column names, wrong option types
        options = rng.choice(
            [
                {"primary_key": [rng.choice(NASTY)]},
                {"primary_key": rng.choice(WRONG_TYPES[:5])},
                {"primary_key": ["id"], rng.choice(NASTY) or "z": 1},
            ]
        )
        body["spec"] = consumer_spec(
            {"type": rng.choice(["replica", "secondary_index", "no_such_type"]), "options": options}
        )
    elif kind == 7:  # a bad trigger
        body["spec"] = {
            "trigger": rng.choice(
                [
                    {"kind": "sometimes"},
                    {"kind": "periodic", "interval": rng.choice(["-1s", "soon", 0, None])},
                    {"kind": "greedy", "share": "yes"},
                ]
            ),
            "iteration": VALID_SPEC["iteration"],
        }
    else:  # a source that does not exist
        body["job"]["table"] = f"missing_{n}"
    if rng.random() < 0.5:  # unicode and quotes in free text must not matter
        body["request_id"] = f"req-{n}-'\"-ü"
    return key, json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()


def test_a_fuzzed_change_log_lands_in_rejects_and_changes_nothing_else(
    spark: SparkSession, app_config: AppConfig
) -> None:
    app_config = replace(app_config, kafka=replace(app_config.kafka, max_message_bytes=4096))
    make_source(spark, app_config, "sales", "orders")
    rng = random.Random(5)
    fuzz = [fuzzed(rng, n, 5000) for n in range(1000, 3000)]
    valid = [message(n) for n in range(10)]
    messages = [*valid[:5], *fuzz, *valid[5:]]
    coordinates = produce_raw(app_config.kafka.bootstrap_servers, app_config.kafka.topic, messages)

    run_once(spark, app_config)

    rejects = table(spark, app_config, "rejects").collect()
    fuzz_offsets = {offset for _, offset in coordinates[5:-5]}
    assert {r["offset"] for r in rejects} == fuzz_offsets
    assert len(rejects) == len(fuzz)
    assert all(r["error_code"] >= 10000 and r["reason"] for r in rejects)
    jobs = catalog_df(spark, app_config).select("account_id", "database", "table", "job_name")
    assert sorted(tuple(r) for r in jobs.collect()) == [
        (1, "sales", "orders", f"job_{n}") for n in range(10)
    ]


def test_a_message_over_the_services_limit_reaches_the_service_and_is_rejected(
    spark: SparkSession, app_config: AppConfig
) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    from lakeprop.changelog import ensure_topic

    ensure_topic(app_config.kafka)  # as the service creates it (default limit: 1 MiB)
    admin = AdminClient({"bootstrap.servers": app_config.kafka.bootstrap_servers})
    resource = ConfigResource("topic", app_config.kafka.topic)
    topic_config = admin.describe_configs([resource])[resource].result(30)
    assert topic_config["max.message.bytes"].value == str(2 * 1_048_576)
    make_source(spark, app_config, "sales", "orders")
    key, value = message(1)
    body = json.loads(value)
    body["padding"] = "x" * 1_100_000
    big = json.dumps(body).encode()
    [(_, offset)] = produce_raw(
        app_config.kafka.bootstrap_servers,
        app_config.kafka.topic,
        [(key, big)],
        **{"message.max.bytes": 3_000_000},
    )

    run_once(spark, app_config)

    [reject] = table(spark, app_config, "rejects").collect()
    assert (reject["offset"], reject["error_code"], reject["payload_size"]) == (
        offset,
        ErrorCode.MESSAGE_TOO_LARGE,
        len(big),
    )
    assert f"{len(big)} bytes, more than the limit of 1048576" in reject["reason"]
