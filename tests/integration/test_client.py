"""The client and the CLI against the real broker (and a broker that is down)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from devkit.harness import cli_settings, make_source, run_once
from devkit.kafka import read_topic
from devkit.specs import replica_spec
from lakeprop import cli, faults
from lakeprop.changelog import JOB_PARTITION
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, EngineConfig, KafkaConfig
from lakeprop.dev.localkafka import free_port
from lakeprop.errors import DeliveryError, InvalidSpecError, TemporaryError
from lakeprop.spec import JobKey
from lakeprop.state.status import JobState

pytestmark = pytest.mark.integration


@pytest.fixture
def app_config(app_config: AppConfig) -> AppConfig:
    """The change log and catalog alone: no iterations run in these tests."""
    return replace(app_config, engine=EngineConfig(enabled=False))


KEY = JobKey(3, "shop", "items", "copy")


def test_delivery_failure_is_an_error_to_the_caller() -> None:
    down = KafkaConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", delivery_timeout=3.0)
    client = LakepropClient(down)
    with pytest.raises(DeliveryError, match=r"was not delivered|was not confirmed") as info:
        client.register_job(KEY, replica_spec())
    assert info.value.is_temporary
    assert "127.0.0.1" in str(info.value)


def test_an_invalid_spec_fails_in_the_client_before_anything_is_sent(
    app_config: AppConfig,
) -> None:
    client = LakepropClient(app_config.kafka)
    with pytest.raises(InvalidSpecError, match="unknown consumer type"):
        client.register_job(KEY, {"iteration": {"consumer": {"type": "nope"}}})
    assert client._producer is None


def test_every_job_message_goes_to_the_job_partition_in_order(app_config: AppConfig) -> None:
    client = LakepropClient(app_config.kafka)
    other = JobKey(KEY.account_id + 1, "elsewhere", "t", "j")  # keyed elsewhere, same partition
    receipts = [
        client.register_job(KEY, replica_spec()),
        client.register_job(other, replica_spec()),
        client.unregister_job(KEY),
        client.update_job_spec(KEY, {"iteration": {"priority": 2}}),
    ]
    assert {r.partition for r in receipts} == {JOB_PARTITION}
    assert [r.offset for r in receipts] == sorted(r.offset for r in receipts)

    got = [
        (key, json.loads(value))
        for _, key, value in read_topic(app_config.kafka.bootstrap_servers, app_config.kafka.topic)
    ]
    assert [k for k, _ in got] == [KEY.message_key, other.message_key, *[KEY.message_key] * 2]
    assert [(v["op"], v["request_id"]) for _, v in got] == [
        ("register", receipts[0].request_id),
        ("register", receipts[1].request_id),
        ("unregister", receipts[2].request_id),
        ("update_spec", receipts[3].request_id),
    ]


def test_an_applied_verdict_is_returned_once_the_catalog_shows_it_too(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """Verdicts are written before their micro-batch's catalog commit (a replay keeps
    them): a wait that returned on the verdict alone would let the next read miss
    the change it reports."""
    make_source(spark, app_config, "shop", "items")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    registered = client.register_job(KEY, replica_spec())
    faults.arm("batch.recorded=raise")
    try:
        with pytest.raises(StreamingQueryException, match=r"injected fault at batch\.recorded"):
            run_once(spark, app_config)
        assert "batch.recorded" in faults.fired()
    finally:
        faults.disarm()
    assert client.request_outcome(registered.request_id, registered)["outcome"] == "applied"
    with pytest.raises(
        TemporaryError, match=r"the catalog did not show job 3/shop\.items/copy written by it"
    ):
        client.wait_for_outcome(registered, timeout=0)

    paused = client.pause_job(KEY)
    again = client.pause_job(KEY)  # applied, and changes no row: nothing to wait for
    run_once(spark, app_config)  # the replay keeps the verdict and commits the catalog
    assert client.wait_for_outcome(registered, timeout=0)["detail"] == "registered"
    assert client.wait_for_outcome(paused, timeout=0)["detail"] == "paused"
    assert client.wait_for_outcome(again, timeout=0)["detail"] == "already paused"
    (job,) = client.list_jobs()
    assert (job.key, job.state) == (KEY, JobState.PAUSED)


def test_cli_register_update_status_list_unregister(
    spark: SparkSession,
    app_config: AppConfig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_source(spark, app_config, "shop", "items")
    base = cli_settings(app_config)
    key = ["--account", "3", "--database", "shop", "--table", "items", "--name", "copy"]

    def no_spark(*_: object) -> None:
        raise AssertionError("a verb that only produces to Kafka started Spark")

    # verbs that only send to the change log never build a session
    monkeypatch.setattr("lakeprop.session.build_session", no_spark)
    assert (
        cli.main(
            [
                *base,
                "register",
                *key,
                "--consumer",
                "replica",
                "--options",
                '{"primary_key": ["id"]}',
                "--trigger",
                "periodic",
                "--interval",
                "5m",
            ]
        )
        == 0
    )
    assert cli.main([*base, "update-spec", *key, "--priority", "8"]) == 0
    monkeypatch.undo()
    # before the service ever ran: one clear line, no traceback
    capsys.readouterr()
    assert cli.main([*base, "status", *key]) == 1
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == (
        "",
        [
            f"error [10003]: no job catalog at {app_config.state.location}/catalog: the service "
            f"has not run with state.location {app_config.state.location} yet (or the config "
            "points elsewhere)"
        ],
    )
    run_once(spark, app_config)
    capsys.readouterr()

    assert cli.main([*base, "--json", "status", *key]) == 0
    status = json.loads(capsys.readouterr().out)
    assert cli.main([*base, "status", *key]) == 0
    job_id = str(status["job_id"])
    assert capsys.readouterr().out.splitlines() == [
        f"JOB                {'ID'.ljust(len(job_id))}  STATE      WATERMARK  LAG  LAST ERROR",
        f"3/shop.items/copy  {job_id.ljust(2)}  completed  -          -",  # no iteration ran
    ]
    assert status["state"] == "completed"
    assert status["spec"] == {
        "trigger": {"kind": "periodic", "interval": 300.0, "share": False},
        "iteration": {
            "priority": 8,
            "consumer": {
                "type": "replica",
                "options": {
                    "primary_key": ["id"],
                    "columns": None,
                    "target_database": None,
                    "target_table": None,
                },
            },
        },
    }
    assert cli.main([*base, "--json", "list", "--state", "completed"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [j["key"]["job_name"] for j in listed] == ["copy"]

    assert cli.main([*base, "unregister", *key]) == 0
    run_once(spark, app_config)
    capsys.readouterr()
    assert cli.main([*base, "list"]) == 0
    assert capsys.readouterr().out == ""
    assert (
        cli.main(
            [
                *base,
                "--json",
                "status",
                *key,
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["drop_at"] is not None
    assert (
        cli.main([*base, "status", "--database", "shop", "--table", "items", "--name", "ghost"])
        == 1
    )
