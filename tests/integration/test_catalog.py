"""Change log -> job catalog, through the real broker, Spark and Delta."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from devkit.harness import (
    catalog_df,
    latest_version,
    make_source,
    rows_df,
    run_once,
    snapshot,
    table,
    ticks_pass,
)
from devkit.specs import expected_row, replica_spec
from devkit.waiting import assert_eventually
from lakeprop.changelog import Command, LogRecord, Operation
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, EngineConfig
from lakeprop.engine.housekeeping import Housekeeping
from lakeprop.service.app import PropagationApp
from lakeprop.service.observer import BatchSummary
from lakeprop.service.stopping import PY4J_CALLBACK_LOGGER
from lakeprop.service.stream import changelog_source
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import apply_commands
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.events import EVENTS_SCHEMA, EventRecord, EventTable
from lakeprop.state.status import JobState

pytestmark = pytest.mark.integration


@pytest.fixture
def app_config(app_config: AppConfig) -> AppConfig:
    """The change log and catalog alone: no iterations run in these tests."""
    return replace(app_config, engine=EngineConfig(enabled=False))


KEY = JobKey(7, "sales", "orders", "orders_copy")


@pytest.fixture
def client(spark: SparkSession, app_config: AppConfig) -> Iterator[LakepropClient]:
    c = LakepropClient(app_config.kafka, app_config.state, spark)
    yield c
    c.close()


def outcomes(spark: SparkSession, config: AppConfig) -> dict[str, str]:
    return {
        r["request_id"]: r["outcome"]
        for r in table(spark, config, "requests").select("request_id", "outcome").collect()
    }


def test_register_update_unregister_and_the_reads_of_one_change_log(
    spark: SparkSession, app_config: AppConfig, client: LakepropClient
) -> None:
    """One run over a change log whose parts each have jobs of their own. It proves:

    * a register creates a completed job with the seed columns;
    * update_spec fills the update's empty fields from the current spec;
    * unregister sets drop_at, and a re-register of the key gets a new job id;
    * unregister or update_spec of an unknown job is not_found and makes no row;
    * get_job_status and list_jobs (by state, by account, with dropped jobs) read
      the catalog by key.

    The catalog is checked whole against every part's rows, and so is each request's
    outcome."""
    table_id = make_source(spark, app_config, "sales", "orders")
    spec = replica_spec()

    # registering creates a completed job with the seed columns
    created = JobKey(7, "sales", "orders", "created")
    created_spec = replica_spec(kind="periodic", interval="30s", share=True)
    create = client.register_job(created, created_spec)

    # update_spec fills the empty fields from the current spec
    updated = JobKey(7, "sales", "orders", "updated")
    update_from = JobSpec.from_json(
        {
            "trigger": {"kind": "periodic", "interval": "1m", "share": True},
            "iteration": {
                "priority": 5,
                "consumer": {
                    "type": "replica",
                    "options": {"primary_key": ["id"], "columns": ["id", "name"]},
                },
            },
        }
    )
    update_register = client.register_job(updated, update_from)
    update = client.update_job_spec(
        updated, {"iteration": {"priority": 9, "consumer": {"options": {"target_table": "copy"}}}}
    )

    # unregister sets drop_at; a re-register gets a new job id
    reregistered = JobKey(7, "sales", "orders", "reregistered")
    register = client.register_job(reregistered, spec)
    unregister = client.unregister_job(reregistered)
    again = client.register_job(reregistered, spec)

    # unregister or update of an unknown job is not found
    unknown = JobKey(7, "sales", "orders", "unknown")
    unknown_unregister = client.unregister_job(unknown)
    unknown_update = client.update_job_spec(unknown, {"iteration": {"priority": 3}})

    # status and list by state
    listed = [JobKey(1, "sales", "orders", f"job_{i}") for i in range(3)]
    listed_registers = [client.register_job(key, spec) for key in listed]
    listed_unregister = client.unregister_job(listed[2])

    run_once(spark, app_config)

    merged = JobSpec.from_json(
        {
            "trigger": {"kind": "periodic", "interval": "1m", "share": True},
            "iteration": {
                "priority": 9,
                "consumer": {
                    "type": "replica",
                    "options": {
                        "primary_key": ["id"],
                        "columns": ["id", "name"],
                        "target_table": "copy",
                    },
                },
            },
        }
    )
    expected = rows_df(
        spark,
        [
            expected_row(created, created_spec, create, table_id),
            expected_row(updated, merged, update_register, table_id, last=update),
            expected_row(
                reregistered,
                spec,
                register,
                table_id,
                last=unregister,
                drop_at=unregister.timestamp,
            ),
            expected_row(reregistered, spec, again, table_id),
            expected_row(listed[0], spec, listed_registers[0], table_id),
            expected_row(listed[1], spec, listed_registers[1], table_id),
            expected_row(
                listed[2],
                spec,
                listed_registers[2],
                table_id,
                last=listed_unregister,
                drop_at=listed_unregister.timestamp,
            ),
        ],
    )
    # the whole catalog: every part's rows, and none for the unknown job
    catalog = catalog_df(spark, app_config)
    assert_df_equality(catalog, expected, ignore_row_order=True)
    applied = [
        create,
        update_register,
        update,
        register,
        unregister,
        again,
        *listed_registers,
        listed_unregister,
    ]
    assert outcomes(spark, app_config) == {
        **{receipt.request_id: "applied" for receipt in applied},
        unknown_unregister.request_id: "not_found",
        unknown_update.request_id: "not_found",
    }

    # update_spec: the client reads the merged spec
    info = client.get_job_status(updated)
    assert info is not None and info.spec == merged.to_json()

    # re-register: two rows of the key with distinct job ids (as every row's); the
    # client reads the live one
    rows = catalog.collect()
    job_ids = [r["job_id"] for r in rows if r["job_name"] == reregistered.job_name]
    assert len(set(job_ids)) == 2
    assert len({r["job_id"] for r in rows}) == len(rows)
    status = client.get_job_status(reregistered)
    assert status is not None and status.drop_at is None and status.create_at == again.timestamp

    # unknown job: no row to read
    assert client.get_job_status(unknown) is None

    # status and list by state, over every part's jobs
    listed_live = [listed[0], listed[1], created, reregistered, updated]  # in key order
    assert [j.key for j in client.list_jobs(state=JobState.COMPLETED)] == listed_live
    assert [j.key for j in client.list_jobs(include_dropped=True)] == [
        *listed,
        created,
        reregistered,  # the dropped job, then the new one (by job id)
        reregistered,
        updated,
    ]
    assert client.list_jobs(state="error") == []
    assert client.list_jobs(account_id=2) == []
    info = client.get_job_status(listed[0])
    assert info is not None
    assert (info.state, info.watermark, info.status["error_code"]) == ("completed", None, 0)
    assert client.get_job_status(JobKey(1, "sales", "orders", "nope")) is None


def test_a_replayed_batch_leaves_every_table_equal_and_a_deleted_checkpoint_the_catalog(
    spark: SparkSession, app_config: AppConfig, client: LakepropClient
) -> None:
    """Three starts on one change log. It proves:

    * Spark re-runs the last batch when its commit is missing, as after a crash:
      the catalog, requests and rejects tables end equal, and the event table
      tells each verdict once;
    * the state tables survive a deleted checkpoint without duplicates: losing
      the checkpoint re-reads the log from the start, and the catalog skips it all."""
    make_source(spark, app_config, "sales", "orders")
    client.register_job(KEY, replica_spec())
    client.update_job_spec(KEY, {"iteration": {"priority": 4}})
    client.register_job(JobKey(7, "sales", "orders", "second"), replica_spec())
    client.unregister_job(JobKey(7, "sales", "orders", "second"))
    client.register_job(JobKey(7, "sales", "orders", "second"), replica_spec(kind="greedy"))
    client.register_job(JobKey(7, "sales", "nowhere", "bad"), replica_spec())  # rejected
    # the deleted checkpoint's part: a job registered, dropped and registered again
    back = JobKey(7, "sales", "orders", "back")
    client.register_job(back, replica_spec())
    client.unregister_job(back)
    client.register_job(back, replica_spec())
    run_once(spark, app_config)
    before = {
        name: snapshot(table(spark, app_config, name))
        for name in ("catalog", "requests", "rejects")
    }
    catalog_before = snapshot(catalog_df(spark, app_config))
    told = verdict_events(spark, app_config)

    # replaying a batch leaves every table equal
    commits = Path(app_config.state.checkpoint_location) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    run_once(spark, app_config)

    after = {
        name: snapshot(table(spark, app_config, name))
        for name in ("catalog", "requests", "rejects")
    }
    assert after == before
    assert len(before["catalog"]) == 5 and len(before["rejects"]) == 1
    # the event table tells each verdict once, however often its batch ran
    assert verdict_events(spark, app_config) == told
    assert len(told) == 9 and len({event_id for event_id, _ in told}) == 9

    # the state tables survive a deleted checkpoint without duplicates
    shutil.rmtree(app_config.state.checkpoint_location)
    run_once(spark, app_config)
    assert snapshot(catalog_df(spark, app_config)) == catalog_before


def verdict_events(spark: SparkSession, config: AppConfig) -> list[tuple[str, str]]:
    events = table(spark, config, "events").where("kind = 'verdict'")
    return sorted((r["event_id"], r["message"]) for r in events.collect())


def test_a_replay_keeps_the_verdict_recorded_before_the_crash(
    spark: SparkSession, app_config: AppConfig, client: LakepropClient
) -> None:
    """A source that appears between the first run and the replay changes nothing."""
    client.register_job(KEY, replica_spec())  # source missing: rejected
    run_once(spark, app_config)
    make_source(spark, app_config, "sales", "orders")
    commits = Path(app_config.state.checkpoint_location) / "commits"
    for p in commits.iterdir():
        p.unlink()
    run_once(spark, app_config)

    assert catalog_df(spark, app_config).count() == 0
    assert table(spark, app_config, "rejects").count() == 1


def test_restarts_on_the_same_checkpoint_apply_everything_once_and_report_a_second_register(
    spark: SparkSession, app_config: AppConfig, client: LakepropClient
) -> None:
    """Three starts on one checkpoint. It proves:

    * a restart on the same checkpoint applies every message exactly once (the
      third start, with nothing new, changes nothing);
    * a second register of a live job, read by a later start, is reported
      (already_exists), not duplicated."""
    table_id = make_source(spark, app_config, "sales", "orders")
    keys = [JobKey(0, "sales", "orders", f"j{i}") for i in range(4)]
    spec = replica_spec()
    receipts = [client.register_job(keys[0], spec), client.register_job(keys[1], spec)]
    first = client.register_job(KEY, spec)  # the live job a second register finds
    run_once(spark, app_config)
    receipts += [client.register_job(keys[2], spec), client.register_job(keys[3], spec)]
    second = client.register_job(KEY, replica_spec(kind="greedy"))  # a second register
    run_once(spark, app_config)
    run_once(spark, app_config)  # nothing new: changes nothing

    # each job once, and KEY with its first register's row alone
    expected = rows_df(
        spark,
        [expected_row(k, spec, r, table_id) for k, r in zip(keys, receipts, strict=True)]
        + [expected_row(KEY, spec, first, table_id)],
    )
    assert_df_equality(catalog_df(spark, app_config), expected, ignore_row_order=True)
    # each request once, with its outcome
    expected_outcomes = {
        **{r.request_id: "applied" for r in receipts},
        first.request_id: "applied",
        second.request_id: "already_exists",
    }
    requests = table(spark, app_config, "requests")
    assert_df_equality(
        requests.select("request_id", "outcome"),
        spark.createDataFrame(
            list(expected_outcomes.items()),
            requests.select("request_id", "outcome").schema,
        ),
        ignore_row_order=True,
    )
    assert outcomes(spark, app_config) == expected_outcomes
    # the second register's verdict says why
    assert client.wait_for_outcome(second)["detail"].startswith(f"job {KEY} already exists")


def test_a_quiet_service_runs_no_micro_batch_until_there_is_work(
    spark: SparkSession, app_config: AppConfig, client: LakepropClient
) -> None:
    """After the start's micro-batch, ticks with nothing due pass without one (no
    Spark work, no state read); a change log message starts one at once."""
    make_source(spark, app_config, "sales", "orders")
    app = PropagationApp(spark, app_config)
    calls: list[tuple[int, int]] = []
    apply_log = app.runner.apply_log

    def counting(records: Sequence[LogRecord], batch_id: int) -> BatchSummary:
        calls.append((batch_id, len(records)))
        return apply_log(records, batch_id)

    app.runner.apply_log = counting  # type: ignore[method-assign]
    query = app.start()
    try:

        def ran(count: int) -> Callable[[], None]:
            def check() -> None:
                assert len(calls) >= count

            return check

        assert_eventually(ran(1), timeout=60)
        ticks_pass(app, 3)
        assert calls == [(0, 0)]
        client.register_job(KEY, replica_spec())
        assert_eventually(ran(2), timeout=60)
        assert calls[1] == (1, 1)
    finally:
        app.stop_query(query)
        app.shutdown()


def test_a_checkpoint_of_the_tick_source_is_carried_over(
    spark: SparkSession, app_config: AppConfig, client: LakepropClient
) -> None:
    """Before the wake topic, the query's second source was a rate tick. A start on
    such a checkpoint reads the change log on from where its last committed
    micro-batch ended: the message that query read is not read again (it applied
    nothing here), the one written after it is."""
    make_source(spark, app_config, "sales", "orders")
    client.register_job(JobKey(7, "sales", "orders", "first"), replica_spec())
    tick = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .select(
            F.lit(None).cast("binary").alias("key"),
            F.lit(None).cast("binary").alias("value"),
            F.lit(None).cast("string").alias("topic"),
            F.lit(None).cast("int").alias("partition"),
            F.lit(None).cast("long").alias("offset"),
            F.col("timestamp"),
            F.lit(True).alias("is_wake"),
        )
    )
    old = (
        changelog_source(spark, app_config.kafka)
        .unionByName(tick)
        .writeStream.option("checkpointLocation", app_config.state.checkpoint_location)
        .foreachBatch(lambda _batch, _batch_id: None)
        .trigger(availableNow=True)
        .start()
    )
    old.awaitTermination(120)
    assert old.exception() is None
    client.register_job(JobKey(7, "sales", "orders", "second"), replica_spec())

    run_once(spark, app_config)

    assert [r["job_name"] for r in catalog_df(spark, app_config).collect()] == ["second"]
    checkpoint = Path(app_config.state.checkpoint_location)
    carried = json.loads((checkpoint / "carried-over.json").read_text())["offsets"]
    assert sum(carried.values()) == 1  # the first message's partition moved past it
    retired = {p.name for p in (checkpoint / "tick-source").iterdir()}
    assert {"commits", "metadata", "offsets"} <= retired


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "arrived while the query stops" in r.getMessage()]


def test_a_micro_batch_refused_while_the_query_stops_ends_it_as_stopped_with_one_log_line(
    spark: SparkSession, app_config: AppConfig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = PropagationApp(spark, app_config)
    query = app.start()
    try:
        ticks_pass(app, 1)
        with app.runner.halted(60, lambda: not query.isActive) as between_batches:
            assert between_batches
            app.waker.nudge()  # a micro-batch arrives

            def refused_and_waiting() -> None:
                assert refusals(caplog)

            assert_eventually(refused_and_waiting, timeout=30, interval=0.1)
            query.stop()  # interrupts the refused batch: the query ends as stopped
        assert not query.isActive
        assert query.exception() is None  # Spark took the refusal for the stop's interrupt
    finally:
        app.stop_query(query)
        app.shutdown()
    assert [r.name for r in refusals(caplog)] == ["lakeprop.service.runner"]
    assert [
        r for r in caplog.records if r.name == PY4J_CALLBACK_LOGGER and r.levelno >= logging.WARNING
    ] == []


@pytest.mark.parametrize(
    ("stopping", "error"),
    [
        (False, r"arrived while the query stops$"),
        # a stop whose interrupt an earlier step of the batch took: the refusal interrupts
        # itself (the query fails here only because nothing stopped it)
        (True, r"arrived while the query stops: refused on .*java.lang.InterruptedException"),
    ],
    ids=["no stop", "stop without its interrupt"],
)
def test_a_micro_batch_refused_while_halted_fails_the_query_unless_a_stop_ends_it(
    spark: SparkSession,
    app_config: AppConfig,
    caplog: pytest.LogCaptureFixture,
    stopping: bool,
    error: str,
) -> None:
    caplog.set_level(logging.INFO)
    app = PropagationApp(spark, app_config)
    app.runner.gate.refusal_wait = 0.5 if not stopping else 60.0
    query = app.start()
    try:
        ticks_pass(app, 1)
        with app.runner.halted(60, lambda: stopping) as between_batches:
            assert between_batches
            app.waker.nudge()  # a micro-batch arrives
            with pytest.raises(StreamingQueryException) as failed:
                query.awaitTermination(60)
            message = failed.value.getMessage()
            assert re.search(error, message, re.MULTILINE), message
            assert ("InterruptedException" in message) == stopping, message
    finally:
        app.stop_query(query)
        app.shutdown()
    assert refusals(caplog) and all(r.name == "lakeprop.service.runner" for r in refusals(caplog))
    assert [
        r for r in caplog.records if r.name == PY4J_CALLBACK_LOGGER and r.levelno >= logging.WARNING
    ] == []


def test_a_flush_or_gc_between_apply_and_commit_writes_no_part_of_the_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch drops a job and registers it again; the new job turns pending at once.
    The flush and GC that run before the batch's commit must not persist the new
    job without the drop (found by the chaos harness: a crash there left the old
    job live and a replay took the drop as applied)."""
    t0 = datetime(2026, 1, 1)

    def record(offset: int) -> LogRecord:
        return LogRecord("log", 0, offset, t0 + timedelta(seconds=offset), None, None)

    spec = replica_spec()
    path = str(tmp_path / "catalog")
    catalog = JobCatalog(spark, path)
    catalog.ensure()
    first = apply_commands(
        [], [Command(Operation.REGISTER, "r1", KEY, record(1), spec=spec)], lambda k, s: "t"
    )
    catalog.stage(first.upserts)
    catalog.commit_staged()
    durable = sorted(map(tuple, table_rows(spark, path)))

    batch = apply_commands(
        catalog.rows(),
        [
            Command(Operation.UNREGISTER, "r2", KEY, record(2)),
            Command(Operation.REGISTER, "r3", KEY, record(3), spec=spec),
        ],
        lambda k, s: "t",
    )
    catalog.stage(batch.upserts)
    new = next(r for r in batch.upserts.values() if r.drop_at is None)
    catalog.remember([replace(new, job_state=JobState.PENDING)])  # its snapshot is queued
    engine = EngineConfig(watermark_flush_interval=1.0, gc_interval=1.0, gc_retention=1.0)
    collected = Housekeeping(catalog, engine, clock=lambda: 0.0).run(t0.timestamp() + 3600)
    assert collected == []  # the drop is not written yet, so not collectable either
    assert sorted(map(tuple, table_rows(spark, path))) == durable  # a crash here: all replayed

    catalog.commit_staged()
    reloaded = JobCatalog(spark, path)
    reloaded.load()
    assert sorted(
        (r.job_id, r.drop_at is None, r.job_state, r.log_offset) for r in reloaded.rows()
    ) == [(1, False, JobState.COMPLETED, 2), (3, True, JobState.PENDING, 3)]


def table_rows(spark: SparkSession, path: str) -> list[object]:
    return spark.read.format("delta").load(path).collect()


def test_a_background_flush_never_writes_over_a_later_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The status flush writes from a thread of its own. A batch's commit that
    gets the table first makes it skip (the commit took its rows along); one
    that comes after it writes the whole table again; memory learns which rows
    are durable only from the table's latest write."""
    t0 = datetime(2026, 1, 1)

    def record(offset: int) -> LogRecord:
        return LogRecord("log", 0, offset, t0 + timedelta(seconds=offset), None, None)

    def register(name: str, offset: int) -> None:
        key = JobKey(1, "db", "t", name)
        cmd = Command(Operation.REGISTER, f"r{offset}", key, record(offset), spec=replica_spec())
        catalog.stage(apply_commands(catalog.rows(), [cmd], lambda k, s: "t").upserts)

    path = str(tmp_path / "catalog")
    catalog = JobCatalog(spark, path)
    catalog.ensure()
    register("a", 1)
    catalog.commit_staged()

    def advanced(version: int) -> None:
        a = next(r for r in catalog.rows() if r.key.job_name == "a")
        catalog.remember([replace(a, watermark=version)], progress=True)

    def stored() -> list[tuple[str, int | None]]:
        return sorted((r["job_name"], r["watermark"]) for r in table_rows(spark, path))

    # 1. the flush goes first, then a batch commits: the table ends with both
    advanced(5)
    assert catalog.flush_in_background() == 1
    register("b", 2)
    catalog.commit_staged()  # waits for the flush's write, then writes everything
    assert stored() == [("a", 5), ("b", None)]
    catalog.settle()
    assert not catalog.behind  # the commit carried the advanced watermark

    # 2. a batch's commit gets the table first: the flush, holding older content, skips
    advanced(7)
    before = latest_version(spark, path)
    with catalog._write_lock:  # the flush's thread waits for the table meanwhile
        assert catalog.flush_in_background() == 1
        register("c", 3)
        catalog.commit_staged()  # this thread holds the lock: it writes first
    assert catalog.flush() == 0  # joins the flush, which skipped: nothing left to write
    assert stored() == [("a", 7), ("b", None), ("c", None)]
    assert not catalog.behind
    assert latest_version(spark, path) == before + 1  # the commit of c alone


def test_one_instance_writes_only_the_rows_it_changed_and_the_table_stays_memory(
    spark: SparkSession, tmp_path: Path
) -> None:
    """New jobs are appended; changed rows of a large catalog (large here: from two
    rows) are MERGEd, a drop collected among them; a row written
    again unchanged makes no commit. After each write the table holds exactly the
    rows memory does."""
    t0 = datetime(2026, 1, 1)
    path = str(tmp_path / "catalog")
    catalog = JobCatalog(spark, path, merge_from=2)
    catalog.ensure()

    def run(*commands: Command) -> None:
        catalog.stage(apply_commands(catalog.rows(), list(commands), lambda k, s: "t").upserts)
        catalog.commit_staged()

    def register(name: str, offset: int) -> Command:
        record = LogRecord("log", 0, offset, t0 + timedelta(seconds=offset), None, None)
        key = JobKey(1, "db", "t", name)
        return Command(Operation.REGISTER, f"r{offset}", key, record, spec=replica_spec())

    def last_write() -> str:
        return str(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["operation"])

    def stored_is_memory() -> None:
        reloaded = JobCatalog(spark, path)
        reloaded.load()
        assert sorted(reloaded.rows(), key=str) == sorted(catalog.rows(), key=str)

    run(register("a", 1), register("b", 2))
    assert last_write() == "WRITE"  # an append: the table held neither
    stored_is_memory()
    a = next(r for r in catalog.rows() if r.key.job_name == "a")
    catalog.remember([replace(a, watermark=5)], progress=True)
    run(register("c", 3))  # c is new, a changed: MERGEd
    assert last_write() == "MERGE"
    stored_is_memory()
    before = latest_version(spark, path)
    catalog.remember([next(r for r in catalog.rows() if r.key.job_name == "b")])
    assert catalog.flush() == 1  # b as the table holds it: nothing to commit
    assert latest_version(spark, path) == before
    catalog.delete([next(r for r in catalog.rows() if r.key.job_name == "b").row_id])
    assert last_write() == "MERGE"
    stored_is_memory()
    assert sorted(r.key.job_name for r in catalog.rows()) == ["a", "c"]

    # a job the table holds twice (an append gone in twice): read once, its latest
    # row, and the next write puts the table right
    a = next(r for r in catalog.rows() if r.key.job_name == "a")
    catalog.table.append([replace(a, watermark=4)])
    reloaded = JobCatalog(spark, path, merge_from=2)
    reloaded.load()
    assert sorted(reloaded.rows(), key=str) == sorted(catalog.rows(), key=str)
    reloaded.remember([replace(a, watermark=6)])
    assert reloaded.flush() == 1
    assert last_write() == "WRITE"  # whole
    assert sorted((r["job_name"], r["watermark"]) for r in table_rows(spark, path)) == [
        ("a", 6),
        ("c", None),
    ]


def test_an_event_table_of_an_earlier_release_gains_ids_and_each_event_goes_in_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "events")
    earlier = StructType([f for f in EVENTS_SCHEMA.fields if f.name != "event_id"])
    old = EventRecord(at=datetime(2026, 1, 1), kind="verdict", level="INFO", message="old")
    spark.createDataFrame([old.as_tuple()[:-1]], earlier).write.format("delta").save(path)
    events = EventTable(spark, path)
    events.ensure()
    new = EventRecord(
        at=datetime(2026, 11, 1), kind="verdict", level="INFO", message="new", event_id="v/1"
    )
    events.insert_new([new])
    events.insert_new([new, replace(new, message="again")])  # a replay: already there
    rows = sorted(
        (r["message"], r["event_id"]) for r in spark.read.format("delta").load(path).collect()
    )
    assert rows == [("new", "v/1"), ("old", None)]
    events.delete_before(datetime(2026, 6, 1))  # the retention
    assert [r["message"] for r in spark.read.format("delta").load(path).collect()] == ["new"]
