"""The chaos harness: crash the service at every fault point, restart it, check it.

Every fault point is reached on purpose. A cycle arms one point, starts the
service, waits until it is ready, and then drives the workload that point
needs (a change log message, a commit to a table two jobs share, a new job's
snapshot, a dropped job for GC) until the point fires, within a bound; a point
not reached by then is reported by name. A cycle crashes the service in one of
two ways:

* **kill**: the service runs as a real ``spark-submit.sh`` process and the
  point ends the whole process tree with SIGKILL. Used where only a process
  death tells the truth: inside an iteration, after some or all consumer
  writes committed and before anything of the iteration is recorded, and
  in a vector index build (``KILL_POINTS``). In-process, a raise there would
  be caught by the iteration (or the build's thread) and recorded as a
  failure: the retry path, not this crash.
  Unarmed kill cycles SIGKILL the tree at a random moment.
* **raise**: the service runs in this process (the checker's SparkSession)
  and the point raises. In a micro-batch that fails the batch before its
  offsets are committed; the service restarts its query on the checkpoint,
  reloads its state from the Delta tables and replays the batch, exactly the
  path a restart after a kill takes, for a fraction of a JVM start. The cycle
  then proves the service recovered (a new message gets its verdict).

Meanwhile a seeded workload runs: jobs of six consumer types and three
trigger kinds are registered, updated, paused, resynced, unregistered and
registered again through the change log, bulk resyncs go over a table's
jobs, and rows are inserted, updated and deleted in two source tables. One
job reads another's target (a replica's), a two-step pipeline with a drop
rule, and is checked against that target like any job against its source (the
rows its rule keeps), its quarantine too: each dropped row version in it once,
none it keeps, every row it drops now. After
the last cycle the service runs once more, unharmed, until every live job has
caught up and every bulk operation has ended. Then the harness checks:

* every change log message has exactly one verdict, ``applied``;
* every bulk operation ended, with each task done (or failed because its job
  was dropped or registered again meanwhile), and each successful resync
  task counted exactly once in its job's consumer generation;
* the catalog's live jobs are exactly those the log implies, with the job ids
  (log coordinates of their registration) and specs it implies;
* every consumer table equals a from-scratch computation over its source at
  the job's watermark version;
* each job's successful iterations chain without gap or overlap: a snapshot,
  then tails each starting where the one before ended, up to the watermark.

The cluster mode (``--instances N``) runs N instances on the workload instead,
kills and pauses random ones past their session timeout, and checks the same;
with ``--rolling`` it restarts them one by one as static members, and also
counts the slots that moved to another instance, which must be none.

Run it as ``scripts/chaos.sh`` (see ``--help``) or through ``pytest -m chaos``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import itertools
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from devkit import cdc_model
from devkit.instances import claims_so_far, slots_moved
from devkit.spark import spark_toml
from lakeprop import faults
from lakeprop.bulk.model import BulkState, TaskState
from lakeprop.changelog import LogRecord
from lakeprop.client.api import LakepropClient, Receipt, TableWatch
from lakeprop.client.reads import StateReader
from lakeprop.client.scans import LakeScan, Query, SparkScan
from lakeprop.config import AppConfig, ClusterConfig, KafkaConfig, StateConfig, load_config
from lakeprop.consumers.fulltext_index import Tokenizer
from lakeprop.consumers.vector_index import live_postings
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey, JobSpec, merge_spec
from lakeprop.state import store as state
from lakeprop.state.apply import job_id_for
from lakeprop.state.history import consumer_digest
from lakeprop.state.status import joined_marks
from lakeprop.state.usage import UsageRow, usage_of
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.stores import session_storage

log = logging.getLogger("chaos")

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "id INT, name STRING, amount DOUBLE, body STRING, emb ARRAY<FLOAT>"
TABLES = ("orders", "notes")
CHAIN_SOURCE = "orders_repl_base"
"""The target of the replica of ``orders``, which base jobs read: a two-step chain."""
JOIN_QUERY = (
    f"SELECT o.id, o.amount, n.name AS note FROM chaos.{CHAIN_SOURCE} AS o "
    "LEFT JOIN chaos.notes AS n ON o.id = n.id"
)
"""The join job's query: every order of the replica, with the name of the note of its
id (a step of the chain, kept from both tables' change feeds)."""
WORDS = ["delta", "Lake", "the", "merge", "café", "log", "x", "Stream", "and", "kafka"]
TOKENIZER = Tokenizer()


KILL_POINTS = frozenset(
    {
        "iteration.between_consumers",
        "iteration.after_writes",
        "iteration.snapshot",
        "index.written",
        "join_view.written",
    }
)
"""Points crashed by a process death; every other point raises in-process."""

Mode = Literal["kill", "raise"]
SLOTS = 8
"""Membership slots of the cluster mode."""
CATALOG_MERGE_FROM = 14
"""Within the catalog's size over a round (11 to 17 jobs), so that one instance's
catalog writes go through each kind: new jobs appended, changes written whole,
and MERGEd."""


@dataclass(frozen=True)
class ChaosSettings:
    seed: int = 1
    random_kills: int = 2
    """Cycles killed with SIGKILL at a random moment (no fault point armed)."""
    points: tuple[str, ...] = tuple(faults.POINTS)
    """Fault points armed one per cycle."""
    kill_everywhere: bool = False
    """Crash every point by process death, not only ``KILL_POINTS`` (slower)."""
    ready_timeout: float = 300.0
    """Bound on a service start (JVM, session, first micro-batch)."""
    fire_timeout: float = 180.0
    """Bound, once the service is ready, on reaching the armed point."""
    redrive_every: float = 8.0
    """How often the armed point's workload is driven again until it fires."""
    recover_timeout: float = 180.0
    kill_after: tuple[float, float] = (3.0, 20.0)
    """Random kills come this many seconds after the service is ready."""
    catch_up_timeout: float = 300.0
    step_pause: float = 0.3
    step_every: float = 1.5
    """While waiting for a point to fire or the service to recover, one random
    step this often (back to back they would starve the service of its cores)."""
    max_extra_jobs: int = 4
    """Live jobs besides the four base jobs: a register beyond this drops one first."""
    instances: int = 0
    """0: one service, crashed at the fault points. More: the cluster mode, that many
    instances sharing the tables, killed and paused at random (:meth:`Chaos.run_cluster`)."""
    cluster_events: int = 4
    """Kills and pauses in the cluster mode, alternating from a random first one."""
    session_timeout: float = 6.0
    """The membership session timeout of the cluster mode's instances."""
    pause_beyond: tuple[float, float] = (1.0, 6.0)
    """A paused instance stays stopped this many seconds past its session timeout."""
    rolling: bool = False
    """The cluster mode restarts the instances one by one instead (``SIGTERM``, then
    the same id again), as static members whose session timeout outlasts a restart:
    no slot may move to another instance."""
    group_protocol: str = "classic"
    """The cluster mode's membership group protocol (``classic`` or ``consumer``)."""
    reslot: int = 0
    """The cluster mode then changes the slot count to this (0: no change) as the
    docs say to: every instance stopped, started again with the new ``cluster.slots``
    on a new ``cluster.topic``; the events go on in the new era."""
    storage: str = ""
    """Where the state, the checkpoint and the tables live (an ``s3a://`` bucket, say);
    empty: the work directory."""
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    """More Spark settings for every service (how to reach ``storage``)."""
    audit: Callable[[], list[str]] | None = None
    """What else to check at the end (every Delta log on an S3 server, say)."""

    def mode(self, point: str | None) -> Mode:
        return "kill" if point is None or self.kill_everywhere or point in KILL_POINTS else "raise"


@dataclass
class Report:
    cycles: int = 0
    kills: int = 0
    raises: int = 0
    pauses: int = 0
    """Instances stopped past their session timeout and resumed (the cluster mode)."""
    restarts: list[float] = field(default_factory=list)
    """Seconds each rolling restart took, from ``SIGTERM`` to the new process's query."""
    slots_moved: int = 0
    """Claims of a slot by another instance than its last claimant, once every instance
    was up (the rolling mode, where it must be 0)."""
    reslots: int = 0
    """Slot-count changes (every instance stopped and started on a new topic)."""
    points_fired: dict[str, int] = field(default_factory=dict)
    points_missed: list[str] = field(default_factory=list)
    messages: int = 0
    commits: int = 0
    differences: list[str] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)
    """Iterations recorded per path (``spark``, ``native``)."""
    owners: set[str] = field(default_factory=set)
    """Instances that recorded iterations (the cluster mode)."""
    recoveries: dict[str, float] = field(default_factory=dict)
    """Seconds from each in-process raise to the next message's verdict."""

    def fired(self, point: str) -> None:
        self.points_fired[point] = self.points_fired.get(point, 0) + 1

    def summary(self) -> str:
        return (
            f"cycles run: {self.cycles} ({self.kills} killed, {self.raises} raised in-process, "
            f"{self.pauses} paused, {len(self.restarts)} restarted, "
            f"{self.reslots} slot-count change(s))\n"
            + (
                f"restart seconds: {[round(r, 1) for r in self.restarts]}, "
                f"slots moved: {self.slots_moved}\n"
                if self.restarts
                else ""
            )
            + f"fault points fired: {dict(sorted(self.points_fired.items()))}\n"
            f"fault points not reached: {self.points_missed}\n"
            f"change log messages: {self.messages}, source commits: {self.commits}\n"
            f"iterations per path: {dict(sorted(self.paths.items()))}\n"
            f"seconds to recover from each raise: "
            f"{ {p: round(s, 1) for p, s in self.recoveries.items()} }\n"
            f"differences found: {len(self.differences)}"
            + "".join(f"\n  - {d}" for d in self.differences)
        )


class InProcessService:
    """The service in this process, on the checker's session: ``run_until`` in a thread."""

    def __init__(self, spark: SparkSession, config: AppConfig) -> None:
        self.spark = spark
        self.config = config
        self.app = PropagationApp(spark, config)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="chaos-service", daemon=True)

    def _run(self) -> None:
        try:
            self.app.run_until(self.stop_event, drain_seconds=60.0)
        except BaseException as exc:  # reported by the harness
            self.error = exc

    def start(self) -> InProcessService:
        self.thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def ready(self) -> bool:
        return any(q.name == self.config.query_name for q in self.spark.streams.active)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=240)
        if self.thread.is_alive():
            raise RuntimeError("the in-process service did not stop within 240s")


def _has_fired(point: str) -> bool:
    return point in faults.fired()


DROP_RULE = {"name": "at_most_40", "check": "amount <= 40", "action": "drop"}
"""The chain's rule: rows above it go to the quarantine (about a fifth of them)."""


def consumer_for(kind: str) -> dict[str, Any]:
    known: dict[str, dict[str, Any]] = {
        "replica": {"primary_key": ["id"]},
        "secondary_index": {"columns": ["name"], "primary_key": ["id"]},
        "fulltext_index": {"columns": ["body"], "primary_key": ["id"]},
        "aggregate_view": {
            "group_by": ["name"],
            "aggregates": [
                {"fn": "count", "as": "n"},
                {"fn": "sum", "column": "amount", "as": "total"},
            ],
        },
        # the same, with a rule dropping rows (updates move rows across it) to a quarantine
        "aggr_rules": {
            "group_by": ["name"],
            "aggregates": [
                {"fn": "count", "as": "n"},
                {"fn": "sum", "column": "amount", "as": "total"},
            ],
            "expectations": [DROP_RULE],
        },
        # change events of an ordinary table by commit version: its latest rows, its history
        "cdc1": {"keys": ["id"], "source_kind": "table"},
        "cdc2": {"keys": ["id"], "source_kind": "table", "stored_as_scd_type": 2},
        # orders with the note of the same id, where there is one: kept from both feeds
        "join": {
            "query": JOIN_QUERY,
            "keys": {"o": ["id"], "n": ["id"]},
        },
        # four lists, re-trained whenever a fifth of the vectors changed: builds mid-run
        "vector_index": {
            "key": ["id"],
            "vector": "emb",
            "lists": 4,
            "retrain": {"max_changed_share": 0.2, "recall_check_every": 0},
        },
    }
    types = {
        "cdc1": "auto_cdc",
        "cdc2": "auto_cdc",
        "aggr_rules": "aggregate_view",
        "join": "join_view",
    }
    return {"type": types.get(kind, kind), "options": known[kind]}


def trigger_for(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["default", "default", "greedy", "periodic"])
    return {"kind": kind, "interval": "3s"} if kind == "periodic" else {"kind": kind}


class Chaos:
    def __init__(
        self,
        spark: SparkSession,
        workdir: Path,
        bootstrap_servers: str,
        settings: ChaosSettings,
    ) -> None:
        self.spark = spark
        self.workdir = workdir
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.kafka = KafkaConfig(
            bootstrap_servers=bootstrap_servers,
            topic=f"chaos-{settings.seed}-{os.getpid()}",
            topic_partitions=2,
            delivery_timeout=15.0,
        )
        root = (settings.storage or str(workdir)).rstrip("/")
        self.state = StateConfig(f"{root}/state", f"{root}/checkpoint")
        self.warehouse = f"{root}/warehouse"
        self.client = LakepropClient(self.kafka, self.state, spark)
        storage = session_storage(spark, AppConfig(kafka=self.kafka, state=self.state))
        self.reader = StateReader(self.state, scan=LakeScan(storage))
        """The state as the CLI reads it, with delta-rs: the polls while a service
        runs (has it recovered, progressed, caught up) then take no Spark job from
        the cores it needs. The checks at the end read with Spark."""
        self.probe = DeltaLogProbe(spark)
        self.cluster = ClusterConfig(
            enabled=bool(settings.instances),
            topic=f"{self.kafka.topic}.members",
            slots=SLOTS,
            session_timeout=settings.session_timeout,
            heartbeat_interval=1.0,
        )
        """The cluster mode's membership (its topic and slot count change with
        ``reslot``)."""
        self.report = Report()
        # the model: what the change log implies
        self.specs: dict[JobKey, dict[str, Any]] = {}
        self.job_ids: dict[JobKey, int] = {}
        self.receipts: list[Receipt] = []
        self.live_rows: dict[str, set[int]] = {t: set() for t in TABLES}
        self.next_id = 1
        self.snapshots = 0
        self.bulks: list[str] = []
        self._next_step = 0.0
        self.logs: dict[int, Path] = {}
        """The log file of each service process, by pid."""

    # -- set-up ---------------------------------------------------------------------------

    def table_path(self, table: str) -> str:
        return f"{self.warehouse}/chaos/{table}"

    def write_config(self) -> Path:
        path = self.workdir / "chaos.toml"
        cluster = (
            f"""[cluster]
enabled = true
topic = "{self.cluster.topic}"
slots = {self.cluster.slots}
session_timeout = "{self.settings.session_timeout:g}s"
heartbeat_interval = "1s"
group_protocol = "{self.settings.group_protocol}"
static_membership = {"true" if self.settings.rolling else "false"}
"""
            if self.settings.instances
            else ""
        )
        master = "local[1]" if self.settings.instances else "local[2]"
        path.write_text(
            f"""tick_interval = "1s"
[kafka]
bootstrap_servers = "{self.kafka.bootstrap_servers}"
topic = "{self.kafka.topic}"
topic_partitions = 2
[local_broker]
enabled = false
[state]
location = "{self.state.location}"
checkpoint_location = "{self.state.checkpoint_location}"
lease_ttl = "8s"
catalog_merge_from = {CATALOG_MERGE_FROM}
[tables]
resolution = "path"
warehouse = "{self.warehouse}"
[engine]
workers = 2
retry_base = "0.5s"
retry_max = "4s"
iteration_timeout = "120s"
watermark_flush_interval = "4s"
gc_interval = "4s"
gc_retention = "4s"
{cluster}{spark_toml("lakeprop-chaos", master, self.settings.spark_conf)}"""
        )
        return path

    def create_sources(self) -> None:
        """The sources; the first keeps its deletes and updates in deletion vectors."""
        for i, table in enumerate(TABLES):
            builder = (
                DeltaTable.create(self.spark)
                .location(self.table_path(table))
                .addColumns(self.spark.createDataFrame([], SCHEMA).schema)
                .property("delta.enableChangeDataFeed", "true")
            )
            if i == 0:
                builder = builder.property("delta.enableDeletionVectors", "true")
            builder.execute()
            self.commit(table, "insert")
        # the replica's target, empty until its snapshot: a job reads it from the start
        DeltaTable.create(self.spark).location(self.table_path(CHAIN_SOURCE)).addColumns(
            self.spark.createDataFrame([], SCHEMA).schema
        ).property("delta.enableChangeDataFeed", "true").execute()

    # -- the service ----------------------------------------------------------------------

    def gate(self, cycle: int) -> Path:
        return self.workdir / f"cycle-{cycle:03d}.go"

    def start_process(
        self, config: Path, cycle: int, fault: str | None, instance: str | None = None
    ) -> subprocess.Popen[bytes]:
        """The service of kill cycle ``cycle``: it builds its session, then waits for
        :meth:`gate` (the previous cycle's service must be dead first). An
        ``instance`` of the cluster mode starts at once, under that id."""
        env = {
            **os.environ,
            faults.ENV: f"{fault}=kill" if fault else "",
            faults.RECORD_ENV: str(self.workdir / f"cycle-{cycle:03d}.fired"),
            faults.GATE_ENV: "" if instance else str(self.gate(cycle)),
        }
        named = ["--set", f'cluster.instance_id="{instance}"'] if instance else []
        path = self.workdir / f"cycle-{cycle:03d}.log"
        logfile = open(path, "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [str(ROOT / "spark-submit.sh"), "--config", str(config), *named],
            cwd=ROOT,
            env=env,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: the script, the JVM, the driver
        )
        self.logs[proc.pid] = path
        return proc

    @staticmethod
    def groups(proc: subprocess.Popen[bytes]) -> list[int]:
        """The process groups of the script, and of spark-submit with the driver (a
        session of their own)."""
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        found = []
        for pid in [int(c) for c in children]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                found.append(os.getpgid(pid))
        return [*dict.fromkeys(found), proc.pid]

    @classmethod
    def kill_tree(cls, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the script, and spark-submit with the driver."""
        for group in cls.groups(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        proc.wait()

    def fired(self, cycle: int) -> str | None:
        record = self.workdir / f"cycle-{cycle:03d}.fired"
        if not record.exists():
            return None
        return record.read_text().split("=", 1)[0] or None

    # -- the workload ---------------------------------------------------------------------

    def commit(self, table: str, op: str | None = None) -> None:
        path = self.table_path(table)
        live = self.live_rows[table]
        rng = self.rng
        op = op or (
            rng.choice(["insert", "update", "update", "update_key", "delete"]) if live else "insert"
        )
        if op == "insert":
            count = rng.randint(1, 5)
            ids = []
            if table == "notes":  # some for live orders: the join job's rows have notes
                free = sorted(self.live_rows["orders"] - live)
                ids = rng.sample(free, k=min(len(free), rng.randint(0, count)))
            new = list(range(self.next_id, self.next_id + count - len(ids)))
            self.next_id += len(new)
            ids += new
            rows = [
                (
                    i,
                    f"g{rng.randint(0, 3)}",
                    float(rng.randint(1, 50)),
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6))),
                    [float(rng.randint(0, 9)), float(i % 7)],
                )
                for i in ids
            ]
            self.spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(path)
            live.update(ids)
        elif op == "update":
            ids = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 3)))
            DeltaTable.forPath(self.spark, path).update(
                F.col("id").isin(ids),
                {
                    "name": F.lit(f"g{rng.randint(0, 3)}"),
                    "amount": F.col("amount") + 1.0,
                    "body": F.lit(" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 4)))),
                    "emb": F.array(
                        F.lit(float(rng.randint(0, 9))), (F.col("id") % 7).cast("float")
                    ),
                },
            )
        elif op == "update_key":  # an update that changes the key: the old key must go
            ids = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 2)))
            moved = {old: self.next_id + n for n, old in enumerate(ids)}
            self.next_id += len(ids)
            cases = " ".join(f"WHEN {old} THEN {new}" for old, new in moved.items())
            self.spark.sql(
                f"UPDATE delta.`{path}` SET id = CASE id {cases} END "
                f"WHERE id IN ({', '.join(map(str, ids))})"
            )
            live.difference_update(ids)
            live.update(moved.values())
        else:
            ids = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 2)))
            DeltaTable.forPath(self.spark, path).delete(F.col("id").isin(ids))
            live.difference_update(ids)
        self.report.commits += 1

    def send(self, receipt: Receipt) -> Receipt:
        self.receipts.append(receipt)
        self.report.messages += 1
        return receipt

    def register(self, key: JobKey, kind: str, trigger: dict[str, Any]) -> None:
        spec = {"trigger": trigger, "iteration": {"consumer": consumer_for(kind)}}
        receipt = self.send(self.client.register_job(key, spec))
        self.specs[key] = JobSpec.from_json(spec).to_json()
        record = LogRecord(
            receipt.topic, receipt.partition, receipt.offset, receipt.timestamp, None, None
        )
        self.job_ids[key] = job_id_for(record)

    def job_step(self) -> None:
        rng = self.rng
        # the base jobs stay, on the default trigger: they keep sharing iterations
        live = self.extra_jobs()
        action = self.job_action(live)
        if action == "bulk":
            self.bulk_resync()
            return
        if action == "update" and (not live or rng.random() < 0.3):
            key = rng.choice(sorted(self.specs, key=str))
            update: dict[str, Any] = {"iteration": {"priority": rng.randint(0, 9)}}
            self.send(self.client.update_job_spec(key, update))
            self.specs[key] = JobSpec.from_json(merge_spec(self.specs[key], update)).to_json()
        elif action == "register" or not live:
            table = rng.choice(TABLES)
            kind = rng.choice(
                ["replica", "secondary_index", "fulltext_index", "aggregate_view", "cdc1", "cdc2"]
            )
            key = JobKey(1, "chaos", table, f"{kind[:4]}{rng.randint(0, 2)}")
            if key not in self.specs:
                self.register(key, kind, trigger_for(rng))
        elif action == "update":
            key = rng.choice(live)
            update = (
                {"iteration": {"priority": rng.randint(0, 9)}}
                if rng.random() < 0.5
                else {"trigger": trigger_for(rng)}
            )
            self.send(self.client.update_job_spec(key, update))
            self.specs[key] = JobSpec.from_json(merge_spec(self.specs[key], update)).to_json()
        elif action == "pause":  # and resume: the job ends the run in step
            key = rng.choice(live)
            self.send(self.client.pause_job(key))
            self.send(self.client.resume_job(key))
        elif action == "resync":
            key = rng.choice(live)
            self.send(self.client.resync_job(key))
            consumer = self.specs[key]["iteration"]["consumer"]
            consumer["generation"] = consumer.get("generation", 0) + 1
        else:
            self.unregister(rng.choice(live))

    def job_action(self, live: list[JobKey]) -> str:
        action = self.rng.choice(
            ["register", "register", "update", "update", "unregister", "pause", "resync", "bulk"]
        )
        if action == "bulk" and self.settings.instances:
            action = "resync"  # several instances refuse bulk commands
        if action in ("pause", "resync") and not live:
            action = "register"
        if action == "register" and len(live) >= self.settings.max_extra_jobs:
            action = "unregister"
        return action

    def extra_jobs(self) -> list[JobKey]:
        """The live jobs the workload registered (the base jobs stay)."""
        return sorted((k for k in self.specs if not k.job_name.endswith("_base")), key=str)

    def unregister(self, key: JobKey) -> None:
        self.send(self.client.unregister_job(key))
        del self.specs[key]
        del self.job_ids[key]

    def step(self) -> None:
        if self.rng.random() < 0.7:
            self.commit(self.rng.choice(TABLES))
        else:
            self.job_step()
        time.sleep(self.settings.step_pause)

    # -- what each fault point needs to be reached ----------------------------------------

    def update_some_job(self) -> None:
        """A change log message that stages a catalog row: a priority update."""
        key = self.rng.choice(sorted(self.specs, key=str))
        update: dict[str, Any] = {"iteration": {"priority": self.rng.randint(0, 9)}}
        self.send(self.client.update_job_spec(key, update))
        self.specs[key] = JobSpec.from_json(merge_spec(self.specs[key], update)).to_json()

    def commit_shared(self) -> None:
        """A commit to a table: its two base jobs share the tail iteration that follows."""
        self.commit(self.rng.choice(TABLES))

    def commit_orders(self) -> None:
        """A commit to the table the SCD type 2 job reads."""
        self.commit("orders")

    def commit_notes(self) -> None:
        """A commit to the table the join job joins: the join's iteration follows (an
        empty tail of its own table when it is in step with it), and writes where the
        commit touched a note of a live order."""
        self.commit("notes")

    def register_new(self) -> None:
        """A new job: its initial snapshot is an iteration of its own."""
        live = self.extra_jobs()
        if len(live) >= self.settings.max_extra_jobs:
            self.unregister(self.rng.choice(live))
        self.snapshots += 1
        kind = self.rng.choice(["replica", "secondary_index", "fulltext_index", "aggregate_view"])
        key = JobKey(1, "chaos", self.rng.choice(TABLES), f"snap{self.snapshots}")
        self.register(key, kind, {"kind": "default"})

    def churn_vectors(self) -> None:
        """A commit to the vector job's table: past a fifth of its vectors changed, the
        tail starts a background build of a new index version."""
        self.commit("notes")

    def bulk_resync(self) -> None:
        """A bulk resync of one table's jobs (its base jobs at least): the model counts
        its successful tasks when it checks (:meth:`fold_bulks`)."""
        bulk_id = f"chaos-bulk-{len(self.bulks)}"
        self.bulks.append(bulk_id)
        self.send(self.client.bulk(1, "resync", table=self.rng.choice(TABLES), bulk_id=bulk_id))

    def drop_one(self) -> None:
        """A dropped job, for garbage collection once the retention has passed."""
        live = self.extra_jobs()
        if not live:
            self.register_new()
            live = [k for k in self.specs if k.job_name == f"snap{self.snapshots}"]
        self.unregister(self.rng.choice(live))

    def driver(self, point: str | None) -> Callable[[], None]:
        drivers: dict[str, Callable[[], None]] = {
            "batch.decoded": self.update_some_job,
            "batch.recorded": self.update_some_job,
            "catalog.written": self.update_some_job,
            "history.written": self.commit_shared,
            "iteration.before_write": self.commit_shared,
            "iteration.between_consumers": self.commit_shared,
            "iteration.after_writes": self.commit_shared,
            "iteration.snapshot": self.register_new,
            "watermarks.flush": self.commit_shared,
            "gc.run": self.drop_one,
            "bulk.written": self.bulk_resync,
            "bulk.applied": self.bulk_resync,
            "index.written": self.churn_vectors,
            "auto_cdc.between_writes": self.commit_orders,
            "join_view.written": self.commit_notes,
        }
        return drivers[point] if point else self.step

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        if self.settings.instances:
            return self.run_cluster()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        self.seed_jobs()
        plan: list[str | None] = [*self.settings.points, *([None] * self.settings.random_kills)]
        return self.run_plan(config, plan)

    def seed_jobs(self) -> None:
        self.create_sources()
        # three default-trigger jobs per table: they share iterations from the start
        starters = {
            "orders": ("replica", "fulltext_index", "cdc2"),
            "notes": ("secondary_index", "aggregate_view", "cdc1", "vector_index"),
        }
        for table, kinds in starters.items():
            for kind in kinds:
                self.register(
                    JobKey(1, "chaos", table, f"{kind[:4]}_base"), kind, {"kind": "default"}
                )
        # and a greedy replica and aggregate view, each alone in its iterations on its
        # table: small tails on the native path
        self.register(JobKey(1, "chaos", "orders", "greedy_base"), "replica", {"kind": "greedy"})
        self.register(
            JobKey(1, "chaos", "notes", "aggr_greedy_base"), "aggregate_view", {"kind": "greedy"}
        )
        # a two-step chain: an aggregate view of the replica's target, with a drop rule,
        # and a join of that target with the notes in its default group (due on a
        # commit to either table)
        self.register(JobKey(1, "chaos", CHAIN_SOURCE, "join_base"), "join", {"kind": "default"})
        self.register(
            JobKey(1, "chaos", CHAIN_SOURCE, "aggr_chain_base"),
            "aggr_rules",
            {"kind": "default"},
        )

    def run_plan(self, config: Path, plan: list[str | None]) -> Report:
        self.rng.shuffle(plan)
        raised = [p for p in plan if p is not None and self.settings.mode(p) == "raise"]
        killed = [p for p in plan if self.settings.mode(p) == "kill"]
        # each killed service starts its JVM while the one before it still runs
        starting = self.start_process(config, 0, killed[0]) if killed else None
        try:
            if raised:  # one in-process service: each raise restarts its query, as a crash would
                self.raise_cycles(config, raised)
            for cycle, point in enumerate(killed):
                log.info("cycle %d: %s", cycle, f"kill at {point}" if point else "random kill")
                assert starting is not None
                proc, starting = starting, None
                starting = self.kill_cycle(proc, cycle, point, self.starter(config, killed, cycle))
                self.report.cycles += 1
        finally:
            if starting is not None:  # a failure left a service waiting at its gate
                self.kill_tree(starting)
        self.catch_up(config)
        self.check()
        return self.report

    def run_cluster(self) -> Report:
        """Several instances share the tables; random ones are killed (and restarted)
        or paused past their session timeout (and resumed) while the workload runs,
        or, with ``rolling``, restarted one by one. With ``reslot`` the slot count
        then changes (:meth:`reslot`) and the events go on. At the end they are all
        killed, and one more instance takes every slot over, fencing what they
        left, and catches up; then the checks run."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        self.seed_jobs()
        names = [f"c{i}" for i in range(self.settings.instances)]
        started = itertools.count()
        running = {name: self.start_process(config, next(started), None, name) for name in names}
        events = ["kill", "pause"] * self.settings.cluster_events
        events = events[self.rng.randrange(2) :][: self.settings.cluster_events]
        if self.settings.rolling:  # each instance in turn, as an operator would
            events = ["restart"] * self.settings.cluster_events
        try:
            played = self.play(running, config, started, events)
            if played and self.settings.reslot:
                config = self.reslot(running, started)
                played = self.play(running, config, started, events[: len(names)])
        finally:
            for proc in running.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                self.kill_tree(proc)
        if not played:
            return self.report
        final = load_config(str(config))
        self.catch_up(replace(final, cluster=replace(final.cluster, instance_id="final")))
        self.check()
        return self.report

    def play(
        self,
        running: dict[str, subprocess.Popen[bytes]],
        config: Path,
        started: Iterator[int],
        events: list[str],
    ) -> bool:
        """Once ``running`` are up, ``events`` one after another on them (their
        processes replaced in ``running``); False if the round cannot go on."""
        for name, proc in running.items():
            if not self.wait_ready(self.ready_check(proc), self.exited(proc)):
                self.report.differences.append(f"instance {name} did not start")
                return False
        progress = self.iterations_recorded()
        settled = self.settled_claims(set(running))
        victims = itertools.cycle(sorted(running))
        for event in events:
            # each event interrupts work in progress: some iteration ran since the last
            if not self.progressed(progress):
                self.report.differences.append(
                    f"cluster: no iteration recorded within {self.settings.fire_timeout:.0f}s "
                    f"before the {event} (logs in {self.workdir})"
                )
                return False
            progress = self.iterations_recorded()
            until = time.monotonic() + self.rng.uniform(*self.settings.kill_after)
            while time.monotonic() < until:
                self.paced_step()
            victim = next(victims) if event == "restart" else self.rng.choice(sorted(running))
            log.info("cluster: %s %s", event, victim)
            self.report.cycles += 1
            running[victim] = self.disrupt(event, running[victim], config, next(started), victim)
        if self.settings.rolling:
            self.report.slots_moved += self.slots_moved(settled)
        return True

    def reslot(self, running: dict[str, subprocess.Popen[bytes]], started: Iterator[int]) -> Path:
        """Change the slot count as the docs say: stop every instance (``SIGTERM``),
        then start them all with the new ``cluster.slots`` on a new ``cluster.topic``;
        the workload runs meanwhile. The new config's path."""
        log.info("cluster: slots %d -> %d", self.cluster.slots, self.settings.reslot)
        for proc in running.values():
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.ready_timeout
        for name, proc in running.items():
            while proc.poll() is None and time.monotonic() < deadline:
                self.paced_step()
            if proc.poll() is None:
                self.report.differences.append(f"instance {name} did not stop on SIGTERM")
                self.kill_tree(proc)
        self.cluster = replace(
            self.cluster,
            topic=f"{self.kafka.topic}.members.{self.settings.reslot}",
            slots=self.settings.reslot,
        )
        config = self.write_config()
        for name in running:
            running[name] = self.start_process(config, next(started), None, name)
        self.report.reslots += 1
        return config

    def disrupt(
        self, event: str, proc: subprocess.Popen[bytes], config: Path, cycle: int, instance: str
    ) -> subprocess.Popen[bytes]:
        """One event of the cluster mode on ``instance``; its process afterwards."""
        if event == "restart":
            return self.restart(proc, config, cycle, instance)
        if event == "kill":
            self.kill_tree(proc)
            self.report.kills += 1
            return self.start_process(config, cycle, None, instance)
        self.pause(proc)
        return proc

    def restart(
        self, proc: subprocess.Popen[bytes], config: Path, cycle: int, instance: str
    ) -> subprocess.Popen[bytes]:
        """Stop an instance as an operator does (``SIGTERM``: it drains and leaves) and
        start it again under its id, the workload running meanwhile."""
        began = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        deadline = began + self.settings.ready_timeout
        while proc.poll() is None and time.monotonic() < deadline:
            self.paced_step()
        if proc.poll() is None:
            self.report.differences.append(f"instance {instance} did not stop on SIGTERM")
            self.kill_tree(proc)
        again = self.start_process(config, cycle, None, instance)
        ready = self.ready_check(again)
        while not ready() and again.poll() is None and time.monotonic() < deadline:
            self.paced_step()
        self.report.restarts.append(time.monotonic() - began)
        return again

    def claims_so_far(self) -> dict[int, list[str]]:
        return claims_so_far(self.kafka, self.cluster)

    def settled_claims(self, names: set[str]) -> dict[int, list[str]]:
        """:meth:`claims_so_far` once the group is balanced: every slot claimed, every
        instance holding within one of the others' count (a query runs before its
        instance has joined the group, and the first assignments move slots on)."""
        deadline = time.monotonic() + self.settings.ready_timeout
        while True:
            claims = self.claims_so_far()
            held = Counter(claimants[-1] for claimants in claims.values())
            balanced = set(held) == names and max(held.values()) - min(held.values()) <= 1
            if (len(claims) == self.cluster.slots and balanced) or time.monotonic() > deadline:
                return claims
            self.paced_step()

    def slots_moved(self, before: dict[int, list[str]]) -> int:
        """Claims made since ``before`` by another instance than the slot's last claimant."""
        return slots_moved(before, self.claims_so_far())

    def iterations_recorded(self) -> int:
        return self._count(state.HISTORY_TABLE, "kind")

    def _count(self, name: str, column: str) -> int:
        """Rows of a state table, by one of its columns, read with delta-rs (see
        :attr:`reader`)."""
        return len(self.reader.scan.rows(self.state.table_path(name), Query((column,))))

    def progressed(self, since: int) -> bool:
        """Whether the history records more iterations than ``since`` within
        ``fire_timeout`` (the workload runs meanwhile)."""
        history = TableWatch(SparkScan(self.spark), self.state.table_path(state.HISTORY_TABLE))
        deadline = time.monotonic() + self.settings.fire_timeout
        while time.monotonic() < deadline:
            if history.changed() and self.iterations_recorded() > since:
                return True
            self.paced_step()
        return False

    @staticmethod
    def exited(proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
        return lambda: proc.poll() is not None

    def ready_check(self, proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
        logfile = self.logs[proc.pid]
        return lambda: b"lakeprop.service.app: query" in logfile.read_bytes()

    def pause(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGSTOP the instance's process tree past its session timeout, then SIGCONT."""
        groups = self.groups(proc)
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
        until = (
            time.monotonic()
            + self.settings.session_timeout
            + self.rng.uniform(*self.settings.pause_beyond)
        )
        try:
            while time.monotonic() < until:
                self.paced_step()
        finally:
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGCONT)
        self.report.pauses += 1

    def starter(
        self, config: Path, killed: list[str | None], cycle: int
    ) -> Callable[[], subprocess.Popen[bytes] | None]:
        """Starts the service of the kill cycle after ``cycle``, if there is one."""

        def start() -> subprocess.Popen[bytes] | None:
            after = cycle + 1
            return self.start_process(config, after, killed[after]) if after < len(killed) else None

        return start

    def drive(self, point: str | None, fired: Callable[[], bool], down: Callable[[], bool]) -> bool:
        """Drive ``point``'s workload, with random steps between, until it fires.

        False when the bound passes first (the point is reported as not reached)
        or the service went down without firing it.
        """
        act = self.driver(point)
        deadline = time.monotonic() + self.settings.fire_timeout
        next_drive = 0.0
        while time.monotonic() < deadline:
            if fired():
                return True
            if down():
                return fired()
            if time.monotonic() >= next_drive:
                act()
                next_drive = time.monotonic() + self.settings.redrive_every
            else:
                self.paced_step()
        return fired()

    def paced_step(self) -> None:
        """A random step if ``step_every`` has passed since the last one, else a short wait."""
        if time.monotonic() >= self._next_step:
            self.step()
            self._next_step = time.monotonic() + self.settings.step_every
        else:
            time.sleep(0.2)

    def wait_ready(self, ready: Callable[[], bool], down: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.settings.ready_timeout
        while time.monotonic() < deadline and not down():
            if ready():
                return True
            time.sleep(0.5)  # leave the cores to the service while it starts
        return False

    def kill_cycle(
        self,
        proc: subprocess.Popen[bytes],
        cycle: int,
        point: str | None,
        start_next: Callable[[], subprocess.Popen[bytes] | None],
    ) -> subprocess.Popen[bytes] | None:
        """Let ``proc`` in, drive it to ``point`` (or a random moment), kill it.

        The next cycle's service is started once this one is ready, and
        returned: it builds its session meanwhile and waits at its gate.
        """
        self.gate(cycle).touch()
        logfile = self.workdir / f"cycle-{cycle:03d}.log"

        def down() -> bool:
            return proc.poll() is not None

        following = None
        try:
            ready = self.wait_ready(
                lambda: b"lakeprop.service.app: query" in logfile.read_bytes(), down
            )
            if not ready and self.fired(cycle) is None:
                self.report.differences.append(
                    f"cycle {cycle}: the service did not start within "
                    f"{self.settings.ready_timeout:.0f}s (see {logfile})"
                )
                return start_next()
            following = start_next()
            if point is None:
                lo, hi = self.settings.kill_after
                until = time.monotonic() + self.rng.uniform(lo, hi)
                while time.monotonic() < until and not down():
                    self.step()
            else:
                self.drive(point, lambda: self.fired(cycle) == point, down)
        except BaseException:
            if following is not None:  # no cycle will let it in
                self.kill_tree(following)
            raise
        finally:
            fired = self.fired(cycle)
            self.kill_tree(proc)
        self.report.kills += 1
        if fired:
            self.report.fired(fired)
        elif point:
            self.report.points_missed.append(
                f"{point} (kill): not reached within {self.settings.fire_timeout:.0f}s of the "
                f"service being ready (see {logfile})"
            )
        if proc.returncode not in (-signal.SIGKILL, 137, 128 + signal.SIGKILL) and not fired:
            self.report.differences.append(
                f"cycle {cycle}: the service exited by itself with {proc.returncode} "
                f"(see {logfile})"
            )
        log.info("cycle %d ended: %s", cycle, fired or "killed")
        return following

    def raise_cycles(self, config: Path, points: list[str]) -> None:
        """Raise at each point in turn in one in-process service, recovering in between."""
        service = InProcessService(self.spark, load_config(str(config))).start()
        down = lambda: not service.alive  # noqa: E731
        try:
            if not self.wait_ready(service.ready, down):
                self.report.differences.append(f"in-process service did not start: {service.error}")
                return
            for point in points:
                log.info("cycle: raise at %s", point)
                self.report.cycles += 1
                faults.arm(f"{point}=raise")
                if self.drive(point, functools.partial(_has_fired, point), down):
                    self.report.fired(point)
                    self.report.raises += 1
                    faults.disarm()
                    self.recovered(service, point)
                else:
                    self.report.points_missed.append(
                        f"{point} (raise): not reached within {self.settings.fire_timeout:.0f}s "
                        "of the service being ready"
                    )
                faults.disarm()
        finally:
            faults.disarm()
            service.stop()
        if service.error is not None:
            self.report.differences.append(f"the in-process service failed: {service.error!r}")

    def recovered(self, service: InProcessService, point: str) -> None:
        """After the raise, the service applies the change log again: a new message's verdict."""
        started = time.monotonic()
        self.update_some_job()
        receipt = self.receipts[-1]
        deadline = started + self.settings.recover_timeout
        requests = TableWatch(SparkScan(self.spark), self.state.table_path(state.REQUESTS_TABLE))
        while time.monotonic() < deadline and service.alive:
            if requests.changed() and self.reader.request_outcome(receipt.request_id) is not None:
                self.report.recoveries[point] = time.monotonic() - started
                return
            self.paced_step()
        stacks = self.workdir / "stuck-threads.txt"
        with stacks.open("w") as out:  # where every thread was when it gave up
            faulthandler.dump_traceback(out, all_threads=True)
        jvm_dump(self.spark, self.workdir / "stuck-jvm.txt")
        queries = [(q.name, q.status, q.lastProgress) for q in self.spark.streams.active]
        log.error("stuck after the fault; queries: %s; threads:\n%s", queries, stacks.read_text())
        self.report.differences.append(
            f"the service did not apply the change log within {self.settings.recover_timeout:.0f}s "
            f"after the fault (alive: {service.alive}, error: {service.error!r}, "
            f"queries: {queries}, threads: {stacks})"
        )

    def catch_up(self, config: Path | AppConfig) -> None:
        loaded = config if isinstance(config, AppConfig) else load_config(str(config))
        service = InProcessService(self.spark, loaded).start()
        self.report.cycles += 1
        # the state is read again only after a commit to the catalog, history or verdicts
        watches = [
            TableWatch(SparkScan(self.spark), self.state.table_path(name))
            for name in (
                state.CATALOG_TABLE,
                state.HISTORY_TABLE,
                state.REQUESTS_TABLE,
                state.BULK_OPERATIONS_TABLE,
            )
        ]
        try:
            deadline = time.monotonic() + self.settings.catch_up_timeout
            while time.monotonic() < deadline:
                if not service.alive:
                    self.report.differences.append(f"the final run ended: {service.error!r}")
                    return
                if any([w.changed() for w in watches]) and self.caught_up():
                    return
                time.sleep(0.5)
            jvm_dump(self.spark, self.workdir / "stuck-jvm.txt")
            self.report.differences.append(
                f"not caught up after {self.settings.catch_up_timeout}s "
                f"(driver JVM: {self.workdir / 'stuck-jvm.txt'})"
            )
        finally:
            service.stop()

    def _state(self, name: str) -> DataFrame:
        return state.read_table(self.spark, self.state.table_path(name))

    def caught_up(self) -> bool:
        try:
            requests = self._count(state.REQUESTS_TABLE, "request_id")
            jobs = self.reader.list_jobs()  # watermarks from the catalog and the history
            bulk_path = self.state.table_path(state.BULK_OPERATIONS_TABLE)
            bulks = [
                BulkState(r["state"]).terminal
                for r in (self.reader.scan.rows(bulk_path, Query(("state",))) if self.bulks else [])
            ]
        except Exception:
            return False
        latest = {t: self.version(t) for t in (*TABLES, CHAIN_SOURCE)}
        return (
            requests >= len(self.receipts)
            and len(bulks) == len(self.bulks)
            and all(bulks)
            and all(j.watermark == latest[j.key.table] for j in jobs)
            and len(jobs) == len(self.specs)
        )

    def version(self, table: str) -> int:
        version = self.probe.latest_version(self.table_path(table))
        assert version is not None, table
        return version

    # -- the checks -----------------------------------------------------------------------

    def differ(self, what: str, expected: object, actual: object) -> None:
        if expected != actual:
            self.report.differences.append(f"{what}: expected {expected!r}, got {actual!r}")

    def check(self) -> None:
        requests = self._state(state.REQUESTS_TABLE).collect()
        verdicts: dict[tuple[int, int], list[str]] = {}
        for r in requests:
            verdicts.setdefault((r["partition"], r["offset"]), []).append(r["outcome"])
        for receipt in self.receipts:
            self.differ(
                f"verdicts of message {receipt.partition}:{receipt.offset}",
                ["applied"],
                verdicts.pop((receipt.partition, receipt.offset), []),
            )
        self.differ("verdicts of messages never sent", {}, verdicts)
        self.differ("rejects", 0, self._state(state.REJECTS_TABLE).count())
        # usage is the history's, whatever was killed between the two: nothing twice
        self.differ(
            "usage (against the iteration history)",
            usage_of(self._state(state.HISTORY_TABLE).collect()),
            sorted(
                (UsageRow(*r) for r in self._state(state.USAGE_TABLE).collect()),
                key=lambda u: (u.account_id, u.job_id, u.hour),
            ),
        )

        self.fold_bulks()
        if self.settings.audit is not None:
            self.report.differences += self.settings.audit()
        for r in self._state(state.HISTORY_TABLE).groupBy("path").count().collect():
            self.report.paths[r["path"]] = r["count"]
        if self.settings.instances:
            owners = self._state(state.HISTORY_TABLE).select("owner").distinct().collect()
            self.report.owners = {r["owner"].split("@")[0] for r in owners}
        catalog = {
            JobKey(r["account_id"], r["database"], r["table"], r["job_name"]): r
            for r in self._state(state.CATALOG_TABLE).where("drop_at IS NULL").collect()
        }
        self.differ("live jobs", sorted(map(str, self.specs)), sorted(map(str, catalog)))
        successes: dict[int, list[Row]] = {}  # the jobs' successful iterations, read once
        for member in (
            self._state(state.HISTORY_TABLE)
            .select("kind", "to_version", F.explode("members").alias("m"))
            .where(F.col("m.error_code") == 0)
            .select("kind", "m.job_id", "m.consumer_digest", "m.from_version", "to_version")
            .collect()
        ):
            successes.setdefault(member["job_id"], []).append(member)
        for key, spec in self.specs.items():
            row = catalog.get(key)
            if row is None:
                continue
            self.differ(f"{key} job id", self.job_ids[key], row["job_id"])
            self.differ(f"{key} spec", JobSpec.from_json(spec).canonical(), row["job_spec"])
            self.differ(f"{key} state", "completed", row["job_state"])
            if row["watermark"] is None:  # never synced: nothing to compare with
                self.report.differences.append(f"{key}: no watermark")
                continue
            mine = successes.get(row["job_id"], [])
            self.check_target(
                key, spec, row["watermark"], self.synced_at(spec, mine), row["job_status"]
            )
            self.check_history(key, spec, mine, row["watermark"])

    def fold_bulks(self) -> None:
        """Every bulk operation ended and none of its tasks is left to run; each
        successful resync task adds one generation to its job's consumer in the
        model, so a task applied twice, or lost, shows in the spec check."""
        if not self.bulks:
            return
        operations = self._state(state.BULK_OPERATIONS_TABLE).collect()
        self.differ("bulk operations", sorted(self.bulks), sorted(o["bulk_id"] for o in operations))
        self.differ(
            "bulk operations not ended",
            [],
            [o["bulk_id"] for o in operations if not BulkState(o["state"]).terminal],
        )
        for task in self._state(state.BULK_TASKS_TABLE).collect():
            key = JobKey(task["account_id"], task["database"], task["table"], task["job_name"])
            live = self.job_ids.get(key) == task["job_id"]
            if task["state"] == TaskState.SUCCESS.value:
                if live:
                    consumer = self.specs[key]["iteration"]["consumer"]
                    consumer["generation"] = consumer.get("generation", 0) + 1
            elif task["state"] != TaskState.FAIL.value or live:
                self.report.differences.append(
                    f"bulk {task['bulk_id']} task {task['task_no']} on {key}: {task['state']} "
                    f"({task['detail']})"
                )

    @staticmethod
    def synced_at(spec: dict[str, Any], successes: list[Row]) -> int | None:
        """The version of the job's latest snapshot of its current consumer."""
        digest = consumer_digest(JobSpec.from_json(spec).iteration.consumer.canonical())
        return max(
            (
                r["to_version"]
                for r in successes
                if r["consumer_digest"] == digest and r["kind"] == "snapshot"
            ),
            default=None,
        )

    def check_target(
        self,
        key: JobKey,
        spec: dict[str, Any],
        version: int,
        synced_at: int | None,
        status: str = "",
    ) -> None:
        consumer = spec["iteration"]["consumer"]
        source = (
            self.spark.read.format("delta")
            .option("versionAsOf", version)
            .load(self.table_path(key.table))
        )
        target = self.spark.read.format("delta").load(
            self.table_path(f"{key.table}_{key.job_name}")
        )
        kind = consumer["type"]
        if kind == "auto_cdc":
            scd = consumer["options"].get("stored_as_scd_type", 1)
            path = self.table_path(key.table)
            columns = ["id", "name", "amount", "body"]
            columns += ["__SEQUENCE"] if scd == 1 else ["__START_AT", "__END_AT"]
            want = [
                tuple(r[c] for c in columns)
                for r in cdc_expected(self.spark, path, synced_at or 0, version, scd)
            ]
            actual = rows(target.select(*columns))
            want = sorted(want, key=str)
            actual = sorted(actual, key=str)
        elif kind == "replica":
            want, actual = rows(source), rows(target.select(*source.columns))
        elif kind == "join_view":
            mark = joined_marks(status).get("chaos.notes")
            if mark is None:
                self.report.differences.append(f"{key}: no version of chaos.notes in its status")
                return
            notes = (
                self.spark.read.format("delta")
                .option("versionAsOf", mark.version)
                .load(self.table_path("notes"))
            )
            joined = source.alias("o").join(
                notes.alias("n"), F.col("o.id") == F.col("n.id"), "left"
            )
            want = rows(joined.select("o.id", "o.amount", F.col("n.name").alias("note")))
            actual = rows(target.select("id", "amount", "note"))
        elif kind == "secondary_index":
            want, actual = rows(source.select("name", "id")), rows(target.select("name", "id"))
        elif kind == "vector_index":
            index = self.spark.read.format("delta").load(
                self.table_path(f"{key.table}_{key.job_name}__index")
            )
            live = live_postings(target, index, "emb")
            want = rows(source.where("emb IS NOT NULL").select("id", "emb"))
            actual = rows(live.select("id", "emb")) if live is not None else []
        elif kind == "aggregate_view":
            rules = consumer["options"].get("expectations") or []
            kept = " AND ".join(f"coalesce({r['check']}, false)" for r in rules) or "true"
            if rules:
                self.check_quarantine(key, source, kept)
            batch = (
                source.where(kept)
                .groupBy("name")
                .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
            )
            want, actual = rows(batch), rows(target.select("name", "n", "total"))
        else:
            want = sorted(
                (term, r["id"], "body", len(ps), ps)
                for r in source.collect()
                for term, ps in postings(r["body"]).items()
            )
            actual = sorted(
                (r["term"], r["id"], r["field"], r["tf"], list(r["positions"]))
                for r in target.collect()
            )
        if want != actual:
            self.report.differences.append(
                f"{key} ({consumer['type']}) at version {version}: "
                f"{len(set(map(str, want)) ^ set(map(str, actual)))} row(s) differ"
            )

    def check_quarantine(self, key: JobKey, source: DataFrame, kept: str) -> None:
        """The job's quarantine holds each row version its rules dropped once, none
        they keep, and every row of the source at the watermark they drop (its
        latest version came from the last snapshot or a later change: both set
        aside what they dropped), as it is now."""
        path = self.table_path(f"{key.table}_{key.job_name}__quarantine")
        if DeltaTable.isDeltaTable(self.spark, path):
            held = self.spark.read.format("delta").load(path)
        else:
            held = source.limit(0).withColumn("__source_version", F.lit(0).cast("long"))
        twice = held.groupBy("id", "__source_version").count().where("count > 1")
        self.differ(f"{key} quarantine: row versions held twice", [], rows(twice))
        self.differ(f"{key} quarantine: rows the rules keep", [], rows(held.where(kept)))
        dropped = source.where(f"NOT ({kept})").select("id", "name", "amount")
        missing = dropped.subtract(held.select("id", "name", "amount"))
        self.differ(f"{key} quarantine: dropped rows missing", [], rows(missing))

    def check_history(
        self, key: JobKey, spec: dict[str, Any], successes: list[Row], watermark: int
    ) -> None:
        """The job's successful iterations (``successes``) since its consumer's last
        change (a resync starts a new generation with a snapshot) chain without gap
        or overlap."""
        digest = consumer_digest(JobSpec.from_json(spec).iteration.consumer.canonical())
        chain = sorted(
            (r["to_version"], r["kind"], r["from_version"])
            for r in successes
            if r["consumer_digest"] == digest
        )
        previous: int | None = None
        for to_version, kind, from_version in chain:
            if kind == "snapshot":
                if previous is not None and to_version <= previous:
                    self.report.differences.append(f"{key}: snapshot at {to_version} overlaps")
            elif from_version != previous:
                self.report.differences.append(
                    f"{key}: tail ({from_version}, {to_version}] after {previous}: "
                    + ("gap" if previous is None or from_version > previous else "overlap")
                )
            previous = to_version
        self.differ(f"{key} last iteration", watermark, previous)


def cdc_expected(
    spark: SparkSession, path: str, synced_at: int, version: int, scd: int
) -> list[dict[str, Any]]:
    """An ``auto_cdc`` table source's target, from the model: its rows at the job's
    snapshot as upserts at that version, then each later commit's last change per key
    (what the commit leaves ranks last; a key left with only an update's pre-image
    moved to another key, and is deleted)."""
    columns = ["name", "amount", "body"]
    snapshot = spark.read.format("delta").option("versionAsOf", synced_at).load(path)
    events = [
        cdc_model.Event((r["id"],), synced_at, cdc_model.UPSERT, tuple((c, r[c]) for c in columns))
        for r in snapshot.collect()
    ]
    if version > synced_at:
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", synced_at + 1)
            .option("endingVersion", version)
            .load(path)
            .collect()
        )
        leaves = ("insert", "update_postimage")
        last: dict[tuple[Any, int], Row] = {}
        for r in sorted(changes, key=lambda r: r["_change_type"] in leaves):
            last[(r["id"], r["_commit_version"])] = r  # what the commit leaves wins
        for (key, at), r in last.items():
            if r["_change_type"] not in leaves:
                events.append(cdc_model.Event((key,), at, cdc_model.DELETE))
            else:
                values = tuple((c, r[c]) for c in columns)
                events.append(cdc_model.Event((key,), at, cdc_model.UPSERT, values))
    if scd == 1:
        return cdc_model.Scd1(columns).apply(events).table(["id"])
    return cdc_model.Scd2(columns, columns).apply(events).table(["id"])


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def postings(text: str | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for position, term in TOKENIZER.tokens(text):
        out.setdefault(term, []).append(position)
    return out


def jvm_dump(spark: SparkSession, path: Path) -> None:
    """The driver JVM's threads, heap and GC counters into ``path`` (through ``jcmd``
    and ``jstat``, so a JVM too busy to answer Py4J is still seen)."""
    gateway = spark.sparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    if proc is None:  # not a JVM this process launched
        return
    pid = str(proc.pid)
    commands = [["jcmd", pid, c] for c in ("GC.heap_info", "VM.uptime", "Thread.print")]
    with path.open("w") as out:
        for command in [*commands, ["jstat", "-gcutil", pid]]:
            out.write(f"== {' '.join(command)}\n")
            out.flush()
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(command, stdout=out, stderr=out, timeout=60, check=False)
