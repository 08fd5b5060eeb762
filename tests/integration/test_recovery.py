"""Faults the service must survive in-process: a second instance, a broker outage,
sources dropped or replaced, targets dropped or altered, a fuzzed change log."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from devkit.harness import (
    SOURCE_SCHEMA,
    catalog_df,
    cdf_source,
    job_row,
    make_source,
    run_once,
    running,
    table,
    wait_for_watermark,
    watches,
)
from devkit.waiting import assert_eventually
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.dev.localkafka import LocalKafka
from lakeprop.errors import ErrorCode
from lakeprop.service.app import PropagationApp
from lakeprop.service.lock import LEASE_FILE, CheckpointInUseError, CheckpointLock
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration


def test_a_second_instance_on_the_same_checkpoint_refuses_to_start(
    spark: SparkSession, app_config: AppConfig
) -> None:
    with running(spark, app_config):
        impatient = replace(app_config, state=replace(app_config.state, lock_wait=0.5))
        second = PropagationApp(spark, impatient)
        with pytest.raises(
            CheckpointInUseError, match=r"in use by another lakeprop instance .*\(waited 0.5s\)"
        ):
            second.start()
    run_once(spark, app_config)  # the lock went with the first instance


def test_a_start_waits_for_the_lock_of_an_instance_killed_a_moment_ago(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL returns before the process has exited, and waiting for a parent does not
    wait for its children: a restart right after a crash can find the lock still held."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    lock_file = checkpoint / "lakeprop.service.lock"
    holder = (  # a script whose child takes the lock, as spark-submit's driver does
        "import fcntl, json, os, time\n"
        f"handle = open({str(lock_file)!r}, 'a+')\n"
        "fcntl.flock(handle, fcntl.LOCK_EX)\n"
        "handle.write(json.dumps({'pid': os.getpid()}))\n"
        "handle.flush()\n"
        "time.sleep(600)\n"
    )
    script = subprocess.Popen(
        ["bash", "-c", f'{sys.executable} -c "$0" & wait', holder], start_new_session=True
    )
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            CheckpointLock(spark, str(checkpoint), wait=120.0).acquire()
        except BaseException as exc:
            errors.append(exc)

    def held_by_the_child() -> None:
        assert lock_file.exists() and '"pid"' in lock_file.read_text()

    def waiting_for_it() -> None:
        assert any("waiting up to 120s" in r.getMessage() for r in caplog.records)

    try:
        assert_eventually(held_by_the_child, timeout=60, interval=0.05)
        caplog.set_level(logging.WARNING, logger="lakeprop.service.lock")
        starting = threading.Thread(target=restart)
        starting.start()
        assert_eventually(waiting_for_it, timeout=60, interval=0.05)
        os.killpg(script.pid, signal.SIGKILL)  # the script and its child
        script.wait()
        starting.join(timeout=150)
        assert not starting.is_alive() and errors == []
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()  # written on taking it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)


def test_a_lease_on_a_hadoop_file_system_checkpoint(spark: SparkSession, tmp_path: Path) -> None:
    location = f"file://{tmp_path}/checkpoint"
    lease = tmp_path / "checkpoint" / LEASE_FILE
    ttl = 3.0
    first = CheckpointLock(spark, location, ttl=ttl)
    first.acquire()
    try:
        with pytest.raises(CheckpointInUseError, match="in use"):
            CheckpointLock(spark, location, ttl=ttl).acquire()
        taken = assert_eventually(lambda: renewed(lease), interval=0.1)

        def outlived_its_ttl() -> None:  # without renewals it would have expired by now
            assert renewed(lease) >= taken + ttl

        assert_eventually(outlived_its_ttl, timeout=30, interval=0.1)
        with pytest.raises(CheckpointInUseError):
            CheckpointLock(spark, location, ttl=ttl).acquire()
    finally:
        first.release()
    assert not lease.exists()
    # a holder that died leaves a stale lease: taken over once it is older than the ttl
    lease.write_text(
        json.dumps({"owner": "gone", "pid": 1, "host": "h", "renewed": time.time() - 10})
    )
    taker = CheckpointLock(spark, location, ttl=ttl)
    taker.acquire()
    taker.release()
    # a lease caught half written is held, by its modification time, until it goes stale
    lease.write_text("")
    with pytest.raises(CheckpointInUseError):
        CheckpointLock(spark, location, ttl=ttl).acquire()
    os.utime(lease, (time.time() - 10, time.time() - 10))
    taker = CheckpointLock(spark, location, ttl=ttl)
    taker.acquire()
    mine = assert_eventually(lambda: renewed(lease), interval=0.1)
    assert mine > time.time() - ttl  # the taker's own lease
    taker.release()


def renewed(lease: Path) -> float:
    """When the lease file says it was renewed (a read during a renewal retries)."""
    try:
        return float(json.loads(lease.read_text())["renewed"])
    except ValueError as exc:
        raise AssertionError(f"lease caught half written: {exc}") from None


def register(client: LakepropClient, key: JobKey, consumer: dict[str, Any]) -> None:
    client.register_job(key, {"trigger": {"kind": "greedy"}, "iteration": {"consumer": consumer}})


def status(spark: SparkSession, config: AppConfig, key: JobKey) -> tuple[str, int, str]:
    row = job_row(spark, config, key)
    decoded = json.loads(row["job_status"])
    return row["job_state"], decoded.get("error_code", 0), decoded.get("error_msg", "")


def wait_for_error(spark: SparkSession, config: AppConfig, key: JobKey, code: ErrorCode) -> str:
    def failed() -> str:
        state, error_code, message = status(spark, config, key)
        assert (state, error_code) == ("error", code), (state, error_code, message)
        return message

    return assert_eventually(failed, timeout=90, changes=watches(spark, config, "catalog"))


def add_rows(spark: SparkSession, path: str, ids: range) -> None:
    spark.createDataFrame([(i, f"n{i}", float(i)) for i in ids], SOURCE_SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)


def test_dropped_and_replaced_sources_fail_their_jobs_and_others_carry_on(
    spark: SparkSession, app_config: AppConfig
) -> None:
    names = ("gone", "swapped", "small", "same", "ok")
    paths = {t: cdf_source(spark, app_config, "s", t) for t in names}
    for path in paths.values():
        add_rows(spark, path, range(1, 4))
        add_rows(spark, path, range(4, 6))
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    keys = {t: JobKey(1, "s", t, "copy") for t in paths}
    for key in keys.values():
        register(client, key, {"type": "replica", "options": {"primary_key": ["id"]}})

    with running(spark, app_config):
        for key in keys.values():
            wait_for_watermark(spark, app_config, key, 2)
        shutil.rmtree(paths["gone"])
        add_rows(spark, paths["ok"], range(6, 8))
        gone = wait_for_error(spark, app_config, keys["gone"], ErrorCode.SOURCE_NOT_DELTA)
        assert "no longer exists" in gone and "re-register" in gone
        wait_for_watermark(spark, app_config, keys["ok"], 3)
    # The TRUNCATE case: a new table where the old one was, younger or older than 2,
    # or at 2 exactly (it looks unchanged: its identity is read at the first probe).
    # Swapped while the service is down: a tick between the drop and the re-create
    # would rightly find the source gone, not replaced.
    for t, commits in (("swapped", 4), ("small", 0), ("same", 2)):
        shutil.rmtree(paths[t])
        cdf_source(spark, app_config, "s", t)
        for c in range(commits):
            add_rows(spark, paths[t], range(10 * c, 10 * c + 2))
    with running(spark, app_config):
        for t in ("swapped", "small", "same"):
            replaced = wait_for_error(spark, app_config, keys[t], ErrorCode.SOURCE_REPLACED)
            assert "replaced by a new table" in replaced and "re-register" in replaced
        # re-registering follows the new table from scratch, and so does a resync
        client.unregister_job(keys["swapped"])
        register(client, keys["swapped"], {"type": "replica", "options": {"primary_key": ["id"]}})
        client.resync_job(keys["same"])
        wait_for_watermark(spark, app_config, keys["swapped"], 4)
        wait_for_watermark(spark, app_config, keys["same"], 2)

    warehouse = app_config.tables.warehouse
    for t in ("ok", "swapped", "same"):
        assert_df_equality(
            spark.read.format("delta").load(f"{warehouse}/s/{t}_copy"),
            spark.read.format("delta").load(paths[t]),
            ignore_row_order=True,
        )


@pytest.mark.floor
def test_a_dropped_or_altered_target_is_a_permanent_error_for_its_job_only(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "t", "src")
    add_rows(spark, path, range(1, 4))
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    consumers = {
        "dropped": {"type": "replica", "options": {"primary_key": ["id"]}},
        "altered": {"type": "replica", "options": {"primary_key": ["id"]}},
        "text": {"type": "fulltext_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
        "fine": {
            "type": "secondary_index",
            "options": {"columns": ["name"], "primary_key": ["id"]},
        },
    }
    keys = {name: JobKey(1, "t", "src", name) for name in consumers}
    for name, consumer in consumers.items():
        register(client, keys[name], consumer)
    warehouse = app_config.tables.warehouse

    with running(spark, app_config):
        for key in keys.values():
            wait_for_watermark(spark, app_config, key, 1)
        shutil.rmtree(f"{warehouse}/t/src_dropped")
        shutil.rmtree(f"{warehouse}/t/src_text")
        spark.createDataFrame([(1, 2)], "id INT, other INT").write.format("delta").mode(
            "overwrite"
        ).option("overwriteSchema", "true").save(f"{warehouse}/t/src_altered")
        add_rows(spark, path, range(4, 6))

        for name in ("dropped", "text"):
            message = wait_for_error(spark, app_config, keys[name], ErrorCode.TARGET_MISSING)
            assert "is missing" in message and "re-register" in message
        altered = wait_for_error(spark, app_config, keys["altered"], ErrorCode.CONSUMER_FAILED)
        assert "Cannot resolve" in altered and "a retry will not fix this" in altered
        wait_for_watermark(spark, app_config, keys["fine"], 2)


@pytest.mark.floor
def test_the_service_survives_a_broker_outage_and_loses_nothing(
    spark: SparkSession, app_config: AppConfig, kafka: LocalKafka
) -> None:
    # the outage fails the query in seconds instead of the source's default 3 x 60 s to
    # fetch offsets, or 120 s to fetch the records of a batch planned just before it
    fail_fast = {
        "fetchOffset.numRetries": "1",
        "kafka.default.api.timeout.ms": "5000",
        "kafka.request.timeout.ms": "3000",
        "kafkaConsumer.pollTimeoutMs": "5000",
    }
    app_config = replace(app_config, kafka=replace(app_config.kafka, source_options=fail_fast))
    make_source(spark, app_config, "b", "src")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    spec = {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    before = client.register_job(JobKey(1, "b", "src", "before"), spec)
    app = PropagationApp(spark, app_config)
    stop = threading.Event()
    runner = threading.Thread(target=app.run_until, args=(stop,), daemon=True)
    runner.start()
    try:
        assert client.wait_for_outcome(before, timeout=90)["outcome"] == "applied"
        last = client.register_job(JobKey(1, "b", "src", "last_before"), spec)
        client.close()
        kafka.stop()

        def query_failed() -> None:  # its Kafka reads fail: run_until restarts it
            assert app.query_failures >= 1

        assert_eventually(query_failed, timeout=240)
        kafka.start()
        client = LakepropClient(app_config.kafka, app_config.state, spark)
        after = client.register_job(JobKey(1, "b", "src", "after"), spec)
        for receipt in (last, after):
            assert client.wait_for_outcome(receipt, timeout=180)["outcome"] == "applied"
        assert runner.is_alive()
    finally:
        stop.set()
        runner.join(timeout=180)
        client.close()
    jobs = catalog_df(spark, app_config).select("job_name").collect()
    assert sorted(r["job_name"] for r in jobs) == ["after", "before", "last_before"]
    assert table(spark, app_config, "rejects").count() == 0


def test_a_restart_after_a_consumer_change_does_not_give_the_new_consumer_the_old_progress(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """Roll-forward from the history takes only what the job's current consumer reached:
    a restart between a consumer change and its snapshot must still run the snapshot."""
    path = cdf_source(spark, app_config, "r", "src")
    spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SOURCE_SCHEMA).write.format("delta").mode(
        "append"
    ).save(path)
    key = JobKey(1, "r", "src", "copy")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    replica = {"type": "replica", "options": {"primary_key": ["id"]}}
    client.register_job(key, {"iteration": {"consumer": replica}})
    with running(spark, app_config):
        wait_for_watermark(spark, app_config, key, 1)
    narrower = {"type": "replica", "options": {"primary_key": ["id"], "columns": ["id", "name"]}}
    client.update_job_spec(key, {"iteration": {"consumer": narrower}})
    client.close()
    run_once(spark, replace(app_config, engine=replace(app_config.engine, enabled=False)))
    assert job_row(spark, app_config, key)["watermark"] is None  # the new consumer starts over

    app = PropagationApp(spark, app_config)
    app.prepare()  # what a restart does first: roll the catalog forward from the history
    assert [r.watermark for r in app.catalog.rows()] == [None]
    assert job_row(spark, app_config, key)["watermark"] is None
    with running(spark, app_config):
        wait_for_watermark(spark, app_config, key, 1)
    target = spark.read.format("delta").load(f"{app_config.tables.warehouse}/r/src_copy")
    assert sorted(map(tuple, target.collect())) == [(1, "a"), (2, "b")]
