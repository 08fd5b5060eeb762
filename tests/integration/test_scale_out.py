"""Three service processes share thirty tables through the membership group.

Each instance is its own ``spark-submit.sh`` process (local master, one core),
on the test's broker and one shared state. The test kills one (SIGKILL),
pauses another past its session timeout (SIGSTOP, then SIGCONT), restarts the
killed one, and commits to every source between the steps. At the end every
replica equals its source, no job's history holds a version range twice, and
what the paused instance did after it woke up was fenced off.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import write_deltalake
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from devkit.harness import cdf_source, cli_settings, history, latest_version, watches
from devkit.instances import Instance, settled, stopped_at_exit
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, ClusterConfig
from lakeprop.membership.members import Member
from lakeprop.membership.slots import slot_of
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

TABLES = 30
SLOTS = 12
SESSION = 6.0


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


@contextlib.contextmanager
def instances(config: AppConfig, state: Path, names: list[str]) -> Iterator[dict[str, Instance]]:
    with stopped_at_exit({name: instance(name, config, state).start() for name in names}) as run:
        yield run


class Fleet:
    """The test's thirty sources, one replica job each."""

    def __init__(self, spark: SparkSession, config: AppConfig) -> None:
        self.spark = spark
        self.config = config
        self.names = [f"t{i:02d}" for i in range(TABLES)]
        self.paths = {name: cdf_source(spark, config, "fleet", name) for name in self.names}
        self.tables = [("fleet", name) for name in self.names]
        self._rows = iter(range(0, 10_000, 2))
        client = LakepropClient(config.kafka, config.state, spark)
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
        """Wait until every table's replica is recorded at its version."""

        def check() -> None:
            done = {
                r["table"]: r["v"]
                for r in history(self.spark, self.config)
                .where("outcome = 'success'")
                .groupBy("table")
                .agg(F.max("to_version").alias("v"))
                .collect()
            }
            behind = {n: (done.get(n), v) for n, v in versions.items() if done.get(n) != v}
            assert not behind, behind

        assert_eventually(
            check, timeout=timeout, changes=watches(self.spark, self.config, "iterations")
        )

    def members(self, expected: set[str]) -> dict[str, Member]:
        """The group once exactly ``expected`` hold all the slots between them."""
        return settled(self.config.kafka, cluster_of(self.config), self.tables, expected)

    def assert_replicas_equal_their_sources(self) -> None:
        for name in self.names:
            assert_df_equality(
                self.spark.read.format("delta").load(
                    f"{self.config.tables.warehouse}/fleet/{name}_copy"
                ),
                self.spark.read.format("delta").load(self.paths[name]),
                ignore_row_order=True,
            )


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

        # SIGKILL one: its tables are served by the other two
        running["i0"].kill()
        versions = fleet.commit_everywhere()
        fleet.members({"i1", "i2"})
        fleet.reached(versions)

        # SIGSTOP another past its session timeout: the third serves everything
        running["i1"].signal(signal.SIGSTOP)
        stopped_at = time.time()
        fleet.members({"i2"})
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

    fleet.assert_replicas_equal_their_sources()
    runs = (
        history(spark, app_config)
        .where("outcome = 'success'")
        .select("database", "table", "kind", "from_version", "to_version", "owner", "ended_at")
        .collect()
    )
    assert_no_range_twice(runs, fleet.names)
    assert {r["owner"].split("@")[0] for r in runs} == {"i0", "i1", "i2"}
    # the killed instance's tables were served by the others after the kill
    killed = {t.split(".")[1] for t in first["i0"].tables}
    assert killed <= {r["table"] for r in runs if not r["owner"].startswith("i0@")}
    assert_nothing_stale_landed(spark, app_config, runs, stopped_at, history_at_resume)


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
    i2 = scraped["i2"]
    assert i2['lakeprop_cluster_slot_handovers_total{direction="gained"}'] > 4, i2
    assert i2['lakeprop_cluster_slot_handovers_total{direction="revoked"}'] >= 1, i2


def assert_no_range_twice(runs: list[Row], names: list[str]) -> None:
    """Each table's successful ranges chain without overlap (a snapshot starts it)."""
    for name in names:
        ranges = sorted(
            (r["from_version"] if r["kind"] == "tail" else -1, r["to_version"])
            for r in runs
            if r["table"] == name
        )
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert start >= end, (name, ranges)


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
