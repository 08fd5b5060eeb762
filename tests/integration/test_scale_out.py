"""Three service processes share six tables through the membership group.

Each instance is its own ``spark-submit.sh`` process (local master, one core),
on the test's broker and one shared state. The test kills one (SIGKILL) and at
the same moment pauses another past its session timeout (SIGSTOP, then
SIGCONT), resyncs a job while it is paused, restarts the killed one, and
commits to every source between the steps. Every table has a replica; one also
has a full-text index, an aggregate view and an ``auto_cdc`` table. At the end
every target equals what its source says, no job's history holds a version
range twice, and what the paused instance did after it woke up was fenced off.
(The chaos harness's cluster mode, ``scripts/chaos.sh --instances 3``, kills
and pauses at random for as long as asked, or restarts one by one.)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import write_deltalake
from pyspark.sql import DataFrame, Row, SparkSession

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.fuzzing import models
from devkit.harness import (
    cdf_source,
    cli_settings,
    history,
    latest_version,
    running,
    state_reader,
    wait_for_watermark,
    watches,
)
from devkit.instances import Instance, settled, stopped_at_exit
from devkit.kafka import produce_raw
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.client.scans import Query, eq
from lakeprop.config import AppConfig, ClusterConfig, NotificationsConfig
from lakeprop.kafka import settings as kafka_settings
from lakeprop.membership.members import Member
from lakeprop.membership.slots import slot_of
from lakeprop.membership.topics import ensure_topics
from lakeprop.notifications import CommitNotice
from lakeprop.spec import JobKey
from lakeprop.state.store import HISTORY_TABLE
from tests.integration.test_recovery import add_rows

pytestmark = pytest.mark.integration

SLOTS = 6
SESSION = 6.0
COLUMNS = ["id", "name", "amount"]
MORE = {
    "text": {"type": "fulltext_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
    "agg": {
        "type": "aggregate_view",
        "options": {"group_by": [], "aggregates": aggregates_of("amount")},
    },
    "cdc": {"type": "auto_cdc", "options": {"keys": ["id"], "source_kind": "table"}},
}
"""Jobs of consumer types on the first table that keep more than one row per key's
change: postings, running sums, tombstones (the chaos harness has them all)."""
SHARED = 1


def cluster_of(config: AppConfig) -> ClusterConfig:
    return ClusterConfig(
        enabled=True,
        topic=f"{config.kafka.topic}.members",
        slots=SLOTS,
        session_timeout=SESSION,
        heartbeat_interval=1.0,
    )


def instance(name: str, config: AppConfig, state: Path) -> Instance:
    return Instance(name, config, state, cluster_of(config))


def one_table_per_slot() -> list[str]:
    """Table names that hash onto every slot once, so each instance holding slots
    holds tables."""
    names: dict[int, str] = {}
    for name in (f"t{i:02d}" for i in itertools.count()):
        names.setdefault(slot_of("fleet", name, SLOTS), name)
        if len(names) == SLOTS:
            return sorted(names.values())
    raise AssertionError("unreachable")


@contextlib.contextmanager
def instances(config: AppConfig, state: Path, names: list[str]) -> Iterator[dict[str, Instance]]:
    with stopped_at_exit({name: instance(name, config, state).start() for name in names}) as run:
        yield run


class Fleet:
    """The test's sources, one on each slot, one replica job each."""

    def __init__(self, spark: SparkSession, config: AppConfig) -> None:
        self.spark = spark
        self.config = config
        self.names = one_table_per_slot()
        self.paths = {name: cdf_source(spark, config, "fleet", name) for name in self.names}
        self.tables = [("fleet", name) for name in self.names]
        self._rows = iter(range(0, 10_000, 2))
        client = self.client = LakepropClient(config.kafka, config.state, spark)
        for name in self.names[:SHARED]:
            for job, consumer in MORE.items():
                client.register_job(
                    JobKey(1, "fleet", name, job),
                    {"trigger": {"kind": "greedy"}, "iteration": {"consumer": consumer}},
                )
        for name in self.names:
            client.register_job(
                JobKey(1, "fleet", name, "copy"),
                {
                    "trigger": {"kind": "greedy"},
                    "iteration": {
                        "consumer": {"type": "replica", "options": {"primary_key": ["id"]}}
                    },
                },
            )

    def commit_everywhere(self) -> dict[str, int]:
        """Two new rows in every source, written by delta-rs (no Spark job here, so
        the instances keep the cores); the versions they made."""
        for name in self.names:
            start = next(self._rows)
            ids = list(range(start, start + 2))
            rows = pa.table(
                {
                    "id": pa.array(ids, pa.int32()),
                    "name": [f"n{i}" for i in ids],
                    "amount": pa.array(ids, pa.float64()),
                }
            )
            write_deltalake(self.paths[name], rows, mode="append")
        return {name: latest_version(self.spark, self.paths[name]) for name in self.names}

    def reached(self, versions: dict[str, int], timeout: float = 240.0) -> None:
        """Wait until every job of every table is recorded at its table's version."""
        wanted = {
            (name, job): version
            for name, version in versions.items()
            for job in ("copy", *(MORE if name in self.names[:SHARED] else ()))
        }

        # read with delta-rs: a Spark read of the history after each of its commits
        # took the cores the three instances share
        reader = state_reader(self.spark, self.config)
        query = Query(
            ("table", "to_version", "outcome", "members"),
            (eq("outcome", "success"),),
            explode="members",
        )

        def check() -> None:
            done: dict[tuple[str, str], int] = {}
            for r in reader.scan.rows(self.config.state.table_path(HISTORY_TABLE), query):
                job = (r["table"], r["job_name"])
                done[job] = max(done.get(job, r["to_version"]), r["to_version"])
            behind = {k: (done.get(k), v) for k, v in wanted.items() if done.get(k) != v}
            assert not behind, behind

        assert_eventually(
            check, timeout=timeout, changes=watches(self.spark, self.config, "iterations")
        )

    def members(self, expected: set[str]) -> dict[str, Member]:
        """The group once exactly ``expected`` hold all the slots between them."""
        return settled(self.config.kafka, cluster_of(self.config), self.tables, expected)

    def target(self, name: str, job: str) -> Callable[[str], DataFrame]:
        path = f"{self.config.tables.warehouse}/fleet/{name}_{job}"
        return lambda suffix: self.spark.read.format("delta").load(path + suffix)

    def assert_targets_equal_their_sources(self) -> None:
        for name in self.names:
            assert_df_equality(
                self.target(name, "copy")(""),
                self.spark.read.format("delta").load(self.paths[name]),
                ignore_row_order=True,
            )
        for name in self.names[:SHARED]:
            source = self.spark.read.format("delta").load(self.paths[name])
            for job, compared in COMPARED.items():
                expected, actual = compared(source, self.target(name, job))
                assert models.Check(f"{name}/{job}", 0, expected, actual).differences() is None


def rows_of(frame: DataFrame, columns: list[str]) -> models.Rows:
    return models.rows_of(frame, columns)


def aggregated_rows(source: DataFrame, target: Callable[[str], DataFrame]) -> tuple[Any, Any]:
    return (
        rows_of(aggregated(source, [], "amount"), AGGREGATE_COLUMNS),
        rows_of(target(""), AGGREGATE_COLUMNS),
    )


COMPARED: dict[str, Callable[[DataFrame, models.Target], tuple[Any, Any]]] = {
    "text": lambda source, target: models.fulltext_index(source, target),
    "agg": aggregated_rows,
    "cdc": lambda source, target: models.auto_cdc_scd1(source, target, COLUMNS),
}
"""(expected, actual) rows of each job of :data:`MORE`."""


@pytest.mark.slow(seconds=220)
@pytest.mark.processes
@pytest.mark.timeout(900)
def test_three_instances_share_the_tables_and_survive_a_kill_a_pause_and_a_rejoin(
    spark: SparkSession, app_config: AppConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = Fleet(spark, app_config)
    versions = fleet.commit_everywhere()
    state = tmp_path / "instances"
    state.mkdir()
    with instances(app_config, state, ["i0", "i1", "i2"]) as running:
        # the slots spread over all three, and so do the tables' iterations
        first = fleet.members({"i0", "i1", "i2"})
        assert all(m.tables for m in first.values()), first
        fleet.reached(versions)
        assert_members_command_lists(app_config, capsys, first)

        # SIGKILL one and SIGSTOP another past its session timeout: the third serves
        # everything, and resyncs a job the paused one may have served
        running["i0"].kill()
        running["i1"].signal(signal.SIGSTOP)
        stopped_at = time.time()
        fleet.members({"i2"})
        fleet.client.resync_job(JobKey(1, "fleet", fleet.names[0], "cdc"))
        versions = fleet.commit_everywhere()
        fleet.reached(versions)
        history_at_resume = history_version(spark, app_config)
        running["i1"].signal(signal.SIGCONT)

        # the killed one restarts, the paused one rejoins: all three share again
        running["i0"] = instance("i0", app_config, state).start()
        fleet.members({"i0", "i1", "i2"})
        versions = fleet.commit_everywhere()
        fleet.reached(versions)
        assert_metrics_show_the_share(running)

    fleet.assert_targets_equal_their_sources()
    runs = (
        history(spark, app_config)
        .where("outcome = 'success'")
        .select(
            "database",
            "table",
            "kind",
            "from_version",
            "to_version",
            "owner",
            "ended_at",
            "members",
        )
        .collect()
    )
    assert_no_range_twice(runs, fleet.names)
    assert {r["owner"].split("@")[0] for r in runs} == {"i0", "i1", "i2"}
    # the killed instance's tables were served by the others after the kill
    killed = {t.split(".")[1] for t in first["i0"].tables}
    assert killed <= {r["table"] for r in runs if not r["owner"].startswith("i0@")}
    assert_nothing_stale_landed(spark, app_config, runs, stopped_at, history_at_resume)
    assert_each_event_told_once(spark, app_config, fleet.names)


def assert_each_event_told_once(spark: SparkSession, config: AppConfig, names: list[str]) -> None:
    """Three instances read every message of the log: each verdict is in the event
    table once, told by the instance serving its table, and each iteration once."""
    events = spark.read.format("delta").load(f"{config.state.location}/events")
    twice = events.groupBy("event_id").count().where("count > 1").collect()
    assert twice == [], twice
    verdicts = events.where("kind = 'verdict'").select("table", "instance").collect()
    assert verdicts and {r["table"] for r in verdicts} <= set(names)


def assert_members_command_lists(
    config: AppConfig, capsys: pytest.CaptureFixture[str], seen: dict[str, Member]
) -> None:
    """``lakeprop members`` shows each instance's slots and tables; ``status`` shows
    each job's owner among them."""
    settings = [
        *cli_settings(config),
        *("--set", f"cluster.topic={config.kafka.topic}.members"),
        *("--set", f"cluster.slots={SLOTS}"),
    ]
    capsys.readouterr()
    assert cli.main([*settings, "--json", "members"]) == 0
    listed = {m["instance"]: m for m in map(json.loads, capsys.readouterr().out.splitlines())}
    assert {i: (tuple(m["slots"]), tuple(m["tables"])) for i, m in listed.items()} == {
        i: (m.slots, m.tables) for i, m in seen.items()
    }
    assert all(m["status"]["instance"] == i for i, m in listed.items())
    assert cli.main([*settings, "list"]) == 0
    table = capsys.readouterr().out
    assert "OWNER" in table.splitlines()[0]
    for instance, member in seen.items():
        for name in member.tables:
            line = next(x for x in table.splitlines() if f"{name}/copy" in x)
            assert f" {instance}@" in line, (instance, line)


def assert_metrics_show_the_share(running: dict[str, Instance]) -> None:
    """Each instance's endpoint names it; between them they serve every slot once,
    one leads, none fences itself, and the one that served alone took slots over."""

    def check() -> dict[str, dict[str, float]]:
        scraped = {name: instance.scrape() for name, instance in running.items()}
        served = [m['lakeprop_cluster_slots{state="served"}'] for m in scraped.values()]
        assert all(served) and sum(served) == SLOTS, scraped
        assert sum(m["lakeprop_cluster_leader"] for m in scraped.values()) == 1, scraped
        return scraped

    scraped = assert_eventually(check, timeout=120, interval=0.5)
    for name, metrics in scraped.items():
        assert metrics[f'lakeprop_cluster_member{{member="{name}"}}'] == 1
        assert metrics["lakeprop_cluster_self_fenced"] == 0
    i2 = scraped["i2"]  # it held every slot while it served alone: each was gained once
    assert i2['lakeprop_cluster_slot_handovers_total{direction="gained"}'] >= SLOTS, i2
    assert i2['lakeprop_cluster_slot_handovers_total{direction="revoked"}'] >= 1, i2


def assert_no_range_twice(runs: list[Row], names: list[str]) -> None:
    """Each job's successful ranges chain without overlap (a snapshot starts it, and a
    resync, a new consumer generation, starts a chain of its own)."""
    chains: dict[tuple[str, int, str | None], list[tuple[int, int]]] = {}
    for r in runs:
        if r["table"] not in names:
            continue
        for m in r["members"]:
            start = m["from_version"] if r["kind"] == "tail" else -1
            chain = (r["table"], m["job_id"], m["consumer_digest"])
            chains.setdefault(chain, []).append((start, r["to_version"]))
    for chain, ranges in chains.items():
        ordered = sorted(ranges)
        for (_, end), (start, _) in itertools.pairwise(ordered):
            assert start >= end, (chain, ordered)


def assert_nothing_stale_landed(
    spark: SparkSession, config: AppConfig, runs: list[Row], stopped_at: float, version: int
) -> None:
    """Nothing the paused instance recorded after it woke up was under the epochs it
    held before the pause: those were fenced when the others took its slots."""

    def held(row: Row) -> tuple[int, str]:  # epochs are per slot
        return slot_of(row["database"], row["table"], SLOTS), row["owner"]

    stale = {
        held(r)
        for r in runs
        if r["owner"].startswith("i1@") and r["ended_at"].timestamp() < stopped_at
    }
    path = config.state.table_path("iterations")
    at_resume = spark.read.format("delta").option("versionAsOf", version).load(path)
    late = [
        r
        for r in spark.read.format("delta").load(path).exceptAll(at_resume).collect()
        if r["owner"] and held(r) in stale
    ]
    assert stale and not late, late


def history_version(spark: SparkSession, config: AppConfig) -> int:
    return latest_version(spark, config.state.table_path("iterations"))


@pytest.mark.timeout(600)
def test_a_new_membership_topic_for_new_slots_keeps_every_catalog_write(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """The documented slot-count change: stop, a new ``cluster.topic`` and
    ``cluster.slots``, start. Offsets start again in the new topic; the catalog's
    era puts the new owners' stamps above the old ones, so their writes land (they
    were skipped, silently, when a stamp was the offset alone)."""
    old = replace(app_config, cluster=replace(cluster_of(app_config), slots=4))
    new = replace(
        app_config,
        cluster=replace(cluster_of(app_config), topic=f"{app_config.kafka.topic}.m2", slots=6),
    )
    # earlier claims and releases: the old topic's offsets are well above the new one's
    ensure_topics(old.kafka, old.cluster)
    busy = [(None, b"{}") for _ in range(30)]
    for slot in range(4):
        produce_raw(
            old.kafka.bootstrap_servers,
            old.cluster.members_topic(old.kafka.topic),
            busy,
            partition=slot,
        )
    path = cdf_source(spark, app_config, "m", "t")
    add_rows(spark, path, range(1, 4))
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    key = JobKey(1, "m", "t", "copy")
    client.register_job(
        key, {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    )
    with running(spark, old):
        wait_for_watermark(spark, old, key, latest_version(spark, path))
    stamped = client.get_job_status(key)
    assert stamped is not None and stamped.owner is not None
    assert int(stamped.owner.split("@")[1]) >= 30

    with running(spark, new):
        add_rows(spark, path, range(4, 6))
        wait_for_watermark(spark, new, key, latest_version(spark, path))
        client.pause_job(key)

        def paused_in_the_table() -> None:
            job = client.get_job_status(key)
            assert job is not None and job.state == "paused", job

        assert_eventually(paused_in_the_table, timeout=120, changes=watches(spark, new, "catalog"))
    job = client.get_job_status(key)
    assert job is not None and job.owner is not None
    assert int(job.owner.split("@")[1]) > int(stamped.owner.split("@")[1])


@pytest.mark.timeout(600)
def test_a_write_to_a_table_another_job_reads_is_announced_to_every_instance(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """With notifications on, a chain's next step may be served by another instance,
    which knows of the write only if it is told: the service announces its own commit
    to a table another live job reads on the notifications topic (and none to a table
    no job reads), so that instance starts the step at once, not at its sweep."""
    config = replace(
        app_config,
        cluster=cluster_of(app_config),
        notifications=NotificationsConfig(
            enabled=True, topic=f"{app_config.kafka.topic}.commits", sweep_interval=600.0
        ),
    )
    path = cdf_source(spark, config, "n", "src")
    add_rows(spark, path, range(1, 4))
    client = LakepropClient(config.kafka, config.state, spark, notifications=config.notifications)
    replica = {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    copy, then = JobKey(1, "n", "src", "copy"), JobKey(1, "n", "src_copy", "next")
    with running(spark, config):
        heard = Notices(config)  # the service made the topic
        client.register_job(copy, replica)
        target = f"{config.tables.warehouse}/n/src_copy"
        wait_for_watermark(spark, config, copy, latest_version(spark, path))
        client.register_job(then, replica)  # once the table it reads is there
        wait_for_watermark(spark, config, then, latest_version(spark, target))
        add_rows(spark, path, range(4, 6))
        client.notify_commit("n", "src", latest_version(spark, path))
        wait_for_watermark(spark, config, copy, latest_version(spark, path))
        wrote = latest_version(spark, target)
        heard.wait_for(("n", "src_copy", wrote))
        wait_for_watermark(spark, config, then, wrote)
    assert ("n", "src_copy_next") not in {(d, t) for d, t, _ in heard.seen}  # nobody reads it
    client.close()


class Notices:
    """The notifications topic, read from its beginning."""

    def __init__(self, config: AppConfig) -> None:
        from confluent_kafka import Consumer

        self.seen: list[tuple[str, str, int]] = []
        self.topic = config.notifications.topic
        self.consumer = Consumer(
            kafka_settings(
                config.kafka,
                {"group.id": f"test-{config.kafka.topic}", "auto.offset.reset": "earliest"},
            )
        )
        self.consumer.subscribe([self.topic])

    def wait_for(self, notice: tuple[str, str, int]) -> None:
        def heard() -> None:
            while (message := self.consumer.poll(0.2)) is not None:
                if message.error() is None:
                    n = CommitNotice.decode(message.value())
                    self.seen.append((n.database, n.table, n.version))
            assert notice in self.seen, self.seen

        try:
            assert_eventually(heard, timeout=120)
        finally:
            self.consumer.close()
