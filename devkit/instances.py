"""Service instances as separate ``spark-submit.sh`` processes, for the tests and
benchmarks of several instances sharing the tables.

Each one runs the cluster config (``conf/cluster.toml``) on a local master of
one core, against the given broker, warehouse and state, with the membership
settings of ``cluster``; its output goes to ``<workdir>/<name>.log``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from devkit.kafka import read_topic
from devkit.spark import TEST_CONF
from devkit.standalone import ROOT
from devkit.waiting import assert_eventually
from lakeprop.config import AppConfig, ClusterConfig, KafkaConfig
from lakeprop.errors import BrokerError
from lakeprop.membership.members import Member, members

SMALL_DATA = (
    "spark.log.level",
    "spark.sql.shuffle.partitions",
    "spark.databricks.delta.snapshotPartitions",
    "spark.sql.codegen.wholeStage",
    "spark.sql.codegen.factoryMode",
)
"""The tests' settings for tables of a few rows, given as a user would: ``--conf``."""


def small_data_conf() -> dict[str, str]:
    return {k: TEST_CONF[k] for k in SMALL_DATA}


class Instance:
    """One ``spark-submit.sh`` process of the service."""

    def __init__(
        self,
        name: str,
        config: AppConfig,
        workdir: Path,
        cluster: ClusterConfig,
        spark_conf: Mapping[str, str] | None = None,
        settings: Mapping[str, str] | None = None,
        master: str = "local[1]",
        env: Mapping[str, str] | None = None,
        cpus: str | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.workdir = workdir
        self.cluster = cluster
        self.spark_conf = small_data_conf() if spark_conf is None else spark_conf
        """The ``--conf`` settings (default: those for tables of a few rows)."""
        self.settings = settings or {}
        self.master = master
        self.env = env or {}
        self.cpus = cpus
        """The cores the process and its children may run on (``taskset -c``); None: any."""
        self.log = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._terminated = False

    def start(self) -> Instance:
        settings = {
            "kafka.topic": self.config.kafka.topic,
            "kafka.create_topic": "true",
            "tick_interval": '"1s"',
            "tables.resolution": '"path"',
            "tables.warehouse": self.config.tables.warehouse,
            "state.location": self.config.state.location,
            "state.checkpoint_location": self.config.state.checkpoint_location,
            "metrics.enabled": "true",
            "metrics.host": '"127.0.0.1"',
            "metrics.port": "0",
            "engine.workers": "2",
            "engine.retry_base": '"1s"',
            "cluster.enabled": "true",
            "cluster.instance_id": self.name,
            "cluster.topic": self.cluster.topic,
            "cluster.slots": str(self.cluster.slots),
            "cluster.session_timeout": f'"{self.cluster.session_timeout:g}s"',
            "cluster.heartbeat_interval": f'"{self.cluster.heartbeat_interval:g}s"',
            "cluster.static_membership": str(self.cluster.static_membership).lower(),
            "cluster.group_protocol": f'"{self.cluster.group_protocol}"',
            **self.settings,
        }
        command = [
            str(ROOT / "spark-submit.sh"),
            *("--master", self.master, "--config", "conf/cluster.toml"),
            *("--conf", "spark.ui.enabled=false"),
            *[arg for k, v in self.spark_conf.items() for arg in ("--conf", f"{k}={v}")],
            *[arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")],
        ]
        if self.cpus is not None:
            command = ["taskset", "-c", self.cpus, *command]
        env = {
            **os.environ,
            "LAKEPROP_KAFKA_BOOTSTRAP": self.config.kafka.bootstrap_servers,
            "LAKEPROP_STATE": str(self.workdir),
            **self.env,
        }
        self._terminated = False
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def scrape(self, prefix: str = "lakeprop_cluster_") -> dict[str, float]:
        """This instance's metrics named ``prefix...``, from its own endpoint (the latest
        start's), by sample name with labels: ``name{label="value"}``."""
        ports = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", self.log.read_text())
        assert ports, f"{self.name} serves no metrics yet"
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/metrics", timeout=10) as r:
            text = r.read().decode()
        return {
            name: float(value)
            for name, value in (line.rsplit(" ", 1) for line in text.splitlines())
            if name.startswith(prefix)
        }

    def session(self) -> int:
        """The session (and process group) of the driver and its JVM: the
        ``setsid`` child of ``spark-submit.sh``."""
        return self._group()

    def _group(self) -> int:
        """The process group of spark-submit (the JVM and the Python driver)."""
        assert self.process is not None
        children = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return int(children[0]) if children else self.process.pid

    def signal(self, sig: int) -> None:
        os.killpg(self._group(), sig)

    def kill(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._group(), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)

    def terminate(self) -> None:
        """Ctrl-C: the script stops the query after its micro-batch and leaves the group.

        Once per start: the script handles the first SIGTERM and dies of a second
        one, which would leave the driver running without its stop."""
        assert self.process is not None
        if self.process.poll() is None and not self._terminated:
            self._terminated = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)

    def stop(self) -> int:
        """:meth:`terminate`, and wait for the process to end."""
        assert self.process is not None
        if self.process.poll() is not None:
            return self.process.returncode
        self.terminate()
        try:
            return self.process.wait(timeout=150)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


@contextlib.contextmanager
def stopped_at_exit(started: dict[str, Instance]) -> Iterator[dict[str, Instance]]:
    """Yield ``started``; at exit resume and stop every instance in it (on a failure,
    print the tail of each one's log first)."""
    try:
        yield started
    except BaseException:
        for instance in started.values():
            print(f"--- {instance.name}\n" + instance.log.read_text()[-6000:])
        raise
    finally:
        for instance in started.values():
            with contextlib.suppress(Exception):
                instance.signal(signal.SIGCONT)
            with contextlib.suppress(Exception):
                instance.terminate()  # all at once: each drains its micro-batch meanwhile
        for instance in started.values():
            with contextlib.suppress(Exception):
                instance.stop()


def settled(
    kafka: KafkaConfig,
    cluster: ClusterConfig,
    tables: list[tuple[str, str]],
    expected: set[str],
    timeout: float = 300.0,
) -> dict[str, Member]:
    """The group, by instance, once exactly ``expected`` hold all the slots between them."""

    def check() -> dict[str, Member]:
        try:
            found = members(kafka, cluster, tables)
        except BrokerError as exc:  # the group's coordinator is still loading
            raise AssertionError(str(exc)) from exc
        seen = {m.instance: m for m in found if m.slots}
        assert set(seen) == expected, seen
        assert sum(len(m.slots) for m in seen.values()) == cluster.slots, seen
        return seen

    return assert_eventually(check, timeout=timeout, interval=0.5)


def claims_so_far(kafka: KafkaConfig, cluster: ClusterConfig) -> dict[int, list[str]]:
    """Per slot, the instances that claimed it so far, in order (the membership
    topic's claim records)."""
    claims: dict[int, list[str]] = {}
    for slot, _, value in read_topic(kafka.bootstrap_servers, cluster.topic):
        record = json.loads(value)
        if record.get("kind") == "claim":
            claims.setdefault(slot, []).append(record["instance"])
    return claims


def slots_moved(before: Mapping[int, list[str]], after: Mapping[int, list[str]]) -> int:
    """Claims in ``after`` (a later :func:`claims_so_far`) made since ``before`` by
    another instance than the slot's last claimant."""
    moved = 0
    for slot, claimants in after.items():
        earlier = before.get(slot, [])
        holder = earlier[-1] if earlier else None
        for instance in claimants[len(earlier) :]:
            moved += holder is not None and instance != holder
            holder = instance
    return moved
