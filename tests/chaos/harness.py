"""The chaos harness: run the service as a real process, kill it, restart it, check it.

Each cycle starts ``spark-submit.sh`` on one checkpoint, with at most one fault
point armed to kill the process tree, and drives a seeded workload while the
service runs: jobs of several consumer types and trigger kinds registered,
updated, unregistered and registered again through the change log, and
inserts, updates and deletes committed to several source tables. A cycle ends
when the armed fault point kills the service, or, for unarmed cycles, when
the harness kills the whole process group with SIGKILL at a random moment.

After the last cycle the service runs once more, unharmed, until every live
job has caught up, and stops cleanly. Then the harness checks:

* every change log message has exactly one verdict, ``applied``;
* the catalog's live jobs are exactly those the log implies, with the job ids
  (log coordinates of their registration) and specs it implies;
* every consumer table equals a from-scratch computation over its source at
  the job's watermark version;
* each job's successful iterations chain without gap or overlap: a snapshot,
  then tails each starting where the one before ended, up to the watermark.

Run it as ``scripts/chaos.sh`` (see ``--help``) or through ``pytest -m chaos``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakeprop import faults, state
from lakeprop.catalog import job_id_for
from lakeprop.changelog import LogRecord
from lakeprop.client import LakepropClient, Receipt
from lakeprop.config import KafkaConfig, StateConfig
from lakeprop.consumers.fulltext_index import Tokenizer
from lakeprop.spec import JobKey, JobSpec, merge_spec

log = logging.getLogger("chaos")

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "id INT, name STRING, amount DOUBLE, body STRING"
TABLES = ("orders", "notes")
WORDS = ["delta", "Lake", "the", "merge", "café", "log", "x", "Stream", "and", "kafka"]
TOKENIZER = Tokenizer()


@dataclass(frozen=True)
class ChaosSettings:
    seed: int = 1
    random_kills: int = 2
    """Cycles killed with SIGKILL at a random moment (no fault point armed)."""
    points: tuple[str, ...] = tuple(faults.POINTS)
    """Fault points armed one per cycle, each cycle until it fires."""
    cycle_timeout: float = 75.0
    """An armed cycle whose point is not reached by then is killed anyway."""
    kill_after: tuple[float, float] = (6.0, 30.0)
    catch_up_timeout: float = 300.0
    step_pause: float = 0.3


@dataclass
class Report:
    cycles: int = 0
    kills: int = 0
    points_fired: dict[str, int] = field(default_factory=dict)
    points_missed: list[str] = field(default_factory=list)
    messages: int = 0
    commits: int = 0
    differences: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"cycles run: {self.cycles}\nkills survived: {self.kills}\n"
            f"fault points fired: {dict(sorted(self.points_fired.items()))}\n"
            f"fault points not reached: {self.points_missed}\n"
            f"change log messages: {self.messages}, source commits: {self.commits}\n"
            f"differences found: {len(self.differences)}"
            + "".join(f"\n  - {d}" for d in self.differences)
        )


def consumer_for(kind: str) -> dict[str, Any]:
    options: dict[str, Any] = {
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
    }[kind]
    return {"type": kind, "options": options}


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
        self.state = StateConfig(str(workdir / "state"), str(workdir / "checkpoint"))
        self.warehouse = workdir / "warehouse"
        self.client = LakepropClient(self.kafka, self.state, spark)
        self.report = Report()
        # the model: what the change log implies
        self.specs: dict[JobKey, dict[str, Any]] = {}
        self.job_ids: dict[JobKey, int] = {}
        self.receipts: list[Receipt] = []
        self.live_rows: dict[str, set[int]] = {t: set() for t in TABLES}
        self.next_id = 1

    # -- set-up ---------------------------------------------------------------------------

    def write_config(self) -> Path:
        path = self.workdir / "chaos.toml"
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
[spark]
app_name = "lakeprop-chaos"
master = "local[2]"
jars_dir = "{ROOT / ".cache" / "jars"}"
[spark.conf]
"spark.ui.enabled" = "false"
"spark.log.level" = "WARN"
"spark.ui.showConsoleProgress" = "false"
"spark.sql.shuffle.partitions" = "2"
"spark.default.parallelism" = "2"
"spark.scheduler.mode" = "FAIR"
"spark.sql.session.timeZone" = "UTC"
"spark.databricks.delta.snapshotPartitions" = "2"
"""
        )
        return path

    def create_sources(self) -> None:
        for table in TABLES:
            (
                DeltaTable.create(self.spark)
                .location(str(self.warehouse / "chaos" / table))
                .addColumns(self.spark.createDataFrame([], SCHEMA).schema)
                .property("delta.enableChangeDataFeed", "true")
                .execute()
            )
            self.commit(table, "insert")

    # -- the service ----------------------------------------------------------------------

    def start_app(self, config: Path, cycle: int, fault: str | None) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            faults.ENV: f"{fault}=kill" if fault else "",
            faults.RECORD_ENV: str(self.workdir / f"cycle-{cycle:03d}.fired"),
        }
        logfile = open(self.workdir / f"cycle-{cycle:03d}.log", "wb")  # noqa: SIM115
        return subprocess.Popen(
            [str(ROOT / "spark-submit.sh"), "--config", str(config)],
            cwd=ROOT,
            env=env,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: the script, the JVM, the driver
        )

    @staticmethod
    def kill_tree(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the script, and spark-submit with the driver (a session of their own)."""
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        for pid in [int(c) for c in children]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def fired(self, cycle: int) -> str | None:
        record = self.workdir / f"cycle-{cycle:03d}.fired"
        if not record.exists():
            return None
        return record.read_text().split("=", 1)[0] or None

    # -- the workload ---------------------------------------------------------------------

    def commit(self, table: str, op: str | None = None) -> None:
        path = str(self.warehouse / "chaos" / table)
        live = self.live_rows[table]
        rng = self.rng
        op = op or (rng.choice(["insert", "update", "update", "delete"]) if live else "insert")
        if op == "insert":
            ids = list(range(self.next_id, self.next_id + rng.randint(1, 5)))
            self.next_id += len(ids)
            rows = [
                (
                    i,
                    f"g{rng.randint(0, 3)}",
                    float(rng.randint(1, 50)),
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6))),
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
                },
            )
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
        live = sorted((k for k in self.specs if not k.job_name.endswith("_base")), key=str)
        action = rng.choice(["register", "register", "update", "update", "unregister"])
        if action == "update" and (not live or rng.random() < 0.3):
            key = rng.choice(sorted(self.specs, key=str))
            update: dict[str, Any] = {"iteration": {"priority": rng.randint(0, 9)}}
            self.send(self.client.update_job_spec(key, update))
            self.specs[key] = JobSpec.from_json(merge_spec(self.specs[key], update)).to_json()
        elif action == "register" or not live:
            table = rng.choice(TABLES)
            kind = rng.choice(["replica", "secondary_index", "fulltext_index", "aggregate_view"])
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
        else:
            key = rng.choice(live)
            self.send(self.client.unregister_job(key))
            del self.specs[key]
            del self.job_ids[key]

    def step(self) -> None:
        if self.rng.random() < 0.7:
            self.commit(self.rng.choice(TABLES))
        else:
            self.job_step()
        time.sleep(self.settings.step_pause)

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        self.create_sources()
        # two default-trigger jobs per table: they share iterations from the start
        starters = {
            "orders": ("replica", "fulltext_index"),
            "notes": ("secondary_index", "aggregate_view"),
        }
        for table, kinds in starters.items():
            for kind in kinds:
                self.register(
                    JobKey(1, "chaos", table, f"{kind[:4]}_base"), kind, {"kind": "default"}
                )
        plan: list[str | None] = [*self.settings.points, *([None] * self.settings.random_kills)]
        self.rng.shuffle(plan)
        for cycle, fault in enumerate(plan):
            self.cycle(config, cycle, fault)
        self.catch_up(config, len(plan))
        self.check()
        return self.report

    def cycle(self, config: Path, cycle: int, fault: str | None) -> None:
        lo, hi = self.settings.kill_after
        deadline = time.monotonic() + (
            self.settings.cycle_timeout if fault else self.rng.uniform(lo, hi) + 15.0
        )
        proc = self.start_app(config, cycle, fault)
        log.info("cycle %d: %s", cycle, f"armed {fault}" if fault else "random kill")
        logfile = self.workdir / f"cycle-{cycle:03d}.log"
        started = False
        while proc.poll() is None and time.monotonic() < deadline:
            if started:
                self.step()
            else:  # leave the cores to the service while it starts
                time.sleep(0.5)
                started = b"lakeprop.app: query" in logfile.read_bytes()
        fired = self.fired(cycle)
        self.kill_tree(proc)
        self.report.cycles += 1
        self.report.kills += 1
        if fired:
            self.report.points_fired[fired] = self.report.points_fired.get(fired, 0) + 1
        elif fault:
            self.report.points_missed.append(fault)
        if proc.returncode not in (-signal.SIGKILL, 137, 128 + signal.SIGKILL) and not fired:
            self.report.differences.append(
                f"cycle {cycle}: the service exited by itself with {proc.returncode} "
                f"(see {self.workdir}/cycle-{cycle:03d}.log)"
            )
        log.info("cycle %d ended: %s", cycle, fired or "killed")

    def catch_up(self, config: Path, cycle: int) -> None:
        proc = self.start_app(config, cycle, None)
        self.report.cycles += 1
        try:
            deadline = time.monotonic() + self.settings.catch_up_timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    self.report.differences.append(f"the final run exited with {proc.returncode}")
                    return
                if self.caught_up():
                    return
                time.sleep(2)
            self.report.differences.append(f"not caught up after {self.settings.catch_up_timeout}s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # spark-submit.sh stops cleanly
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    self.kill_tree(proc)

    def _state(self, name: str) -> DataFrame:
        return state.read_table(self.spark, self.state.table_path(name))

    def caught_up(self) -> bool:
        try:
            requests = self._state(state.REQUESTS_TABLE).count()
            catalog = self._state(state.CATALOG_TABLE).where("drop_at IS NULL").collect()
        except Exception:
            return False
        latest = {t: self.version(t) for t in TABLES}
        return (
            requests >= len(self.receipts)
            and all(
                r["watermark"] == latest[r["table"]] and r["job_state"] == "completed"
                for r in catalog
            )
            and len(catalog) == len(self.specs)
        )

    def version(self, table: str) -> int:
        path = str(self.warehouse / "chaos" / table)
        return int(DeltaTable.forPath(self.spark, path).history(1).first()["version"])  # type: ignore[index]

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

        catalog = {
            JobKey(r["account_id"], r["database"], r["table"], r["job_name"]): r
            for r in self._state(state.CATALOG_TABLE).where("drop_at IS NULL").collect()
        }
        self.differ("live jobs", sorted(map(str, self.specs)), sorted(map(str, catalog)))
        for key, spec in self.specs.items():
            row = catalog.get(key)
            if row is None:
                continue
            self.differ(f"{key} job id", self.job_ids[key], row["job_id"])
            self.differ(f"{key} spec", JobSpec.from_json(spec).canonical(), row["job_spec"])
            self.differ(f"{key} state", "completed", row["job_state"])
            self.check_target(key, spec, row["watermark"])
            self.check_history(key, row["job_id"], row["watermark"])

    def check_target(self, key: JobKey, spec: dict[str, Any], version: int) -> None:
        consumer = spec["iteration"]["consumer"]
        source = (
            self.spark.read.format("delta")
            .option("versionAsOf", version)
            .load(str(self.warehouse / "chaos" / key.table))
        )
        target = self.spark.read.format("delta").load(
            str(self.warehouse / "chaos" / f"{key.table}_{key.job_name}")
        )
        kind = consumer["type"]
        if kind == "replica":
            want, actual = rows(source), rows(target.select(*source.columns))
        elif kind == "secondary_index":
            want, actual = rows(source.select("name", "id")), rows(target.select("name", "id"))
        elif kind == "aggregate_view":
            batch = source.groupBy("name").agg(
                F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total")
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

    def check_history(self, key: JobKey, job_id: int, watermark: int) -> None:
        members = (
            self._state(state.HISTORY_TABLE)
            .select("kind", "to_version", F.explode("members").alias("m"))
            .where((F.col("m.job_id") == job_id) & (F.col("m.error_code") == 0))
            .select("kind", "m.from_version", "to_version")
            .collect()
        )
        chain = sorted((r["to_version"], r["kind"], r["from_version"]) for r in members)
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


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def postings(text: str | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for position, term in TOKENIZER.tokens(text):
        out.setdefault(term, []).append(position)
    return out
