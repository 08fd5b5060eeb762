"""Many: N tables x K consumers, as NxK DIY streaming queries or as one service.

The comparison that says why the service exists. ``tables`` source tables with
``k`` replicas each:

* DIY: NxK Structured Streaming queries in one driver, each reading one table's
  change feed (``readChangeFeed``, ``processingTime`` = ``trigger``) and MERGEing
  into its replica, as a Spark user writes them today;
* lakeprop: one service with the same NxK ``replica`` jobs, commit notifications
  on (the writer announces each commit on the notifications topic, as the
  listener does).

For each side, one after the other in this process:

* **start-up**: from starting until every query has run a micro-batch (DIY), or
  until every job has its first snapshot (lakeprop);
* **idle with no job**: the same service before any job is registered, against
  Spark alone (no query at all), measured the same way;
* **idle**, ``idle`` seconds with no commit, ``settle`` seconds after the start
  (the first minute or so after a start is the JIT compiling Spark's and Delta's
  code and the start's last Spark jobs, not idling): the driver's CPU (the JVM
  and this Python process together) and the micro-batches run, then
  file-system operations per minute on the side's own files (sources, sinks,
  checkpoints, state), traced (:func:`traced_operations`: on an object store
  each is a paid request; Hadoop's statistics count no operations on a local
  disk);
* **trickle**, one commit per second on random tables for ``trickle`` seconds:
  commit-to-sink latency p50 and p95, and whether the side kept up (every commit
  reached every sink of its table within the bound);
* the driver's memory (JVM and Python resident sizes) at the end.

The commits are written with delta-rs, as a writer outside this Spark would.
The check: every replica of both sides equals its source at the end.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.common import (
    Figure,
    Result,
    app_config,
    diy_merge,
    eventually,
    percentile,
    same_rows,
    sources,
    wait_until,
)
from bench.latency import _commit_time, _diy_visible, _lakeprop_visible
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey

TITLE = "many"
"""The benchmark's name in its results."""

REPLICA = {"type": "replica", "options": {"primary_key": ["id"]}}
CATCH_UP_BOUND_S = 600
"""How long a side that fell behind the trickle gets to catch up before its
replicas are compared with their sources."""
STARTUP_BOUND_S = 600
"""A DIY query that has not run its first micro-batch by then counts as failed (a
driver collecting garbage for ever never fails them outright)."""


def jvm_pid(spark: SparkSession) -> int:
    return int(spark.sparkContext._gateway.proc.pid)  # type: ignore[union-attr]


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far, and of this one."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return (int(fields[11]) + int(fields[12])) / ticks + own.user + own.system


def live_mib(spark: SparkSession) -> float:
    """The driver's live memory, MiB: the JVM's heap in use after a full collection
    (both sides share this JVM, whose resident size never shrinks), and this
    Python process's resident size."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.java.lang.System.gc()
    runtime = jvm.java.lang.Runtime.getRuntime()
    heap = int(runtime.totalMemory()) - int(runtime.freeMemory())
    python = 0
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            python = int(line.split()[1]) * 1024
    return (heap + python) / 2**20


def traced_operations(pids: list[int], seconds: float, *under: str) -> list[int]:
    """File-system operations these processes make in ``seconds`` on paths under
    each of ``under``: opens of such a path, traced with ``strace``. Opening a directory
    lists it (a LIST request on an object store), opening a file reads it (a GET);
    the stat of every entry a local listing makes is left out, as an object store's
    LIST returns those. Hadoop's ``FileSystem`` statistics would be the direct
    measure, but on the local file system they count bytes, not operations.

    Every thread alive when tracing starts is traced (Spark's and Delta's pools
    are), but not what they fork: a child forked under ``strace -f`` can be left
    stopped when the tracer detaches, and the JVM waits on it for ever."""
    threads = [int(t.name) for pid in pids for t in Path(f"/proc/{pid}/task").iterdir()]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "trace"
        command = ["strace", "-qq", "-e", "trace=open,openat", "-o", str(out)]
        for tid in threads:
            command += ["-p", str(tid)]
        tracer = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        time.sleep(seconds)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=120)
        lines = out.read_text(errors="replace").splitlines()
        return [sum(f'"{prefix}' in line for line in lines) for prefix in under]


def _commit(path: str, n: int) -> int:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    row = pa.table(
        {
            "id": pa.array([1_000_000 + n], pa.int32()),
            "name": pa.array([f"w{n}"]),
            "amount": pa.array([float(n)]),
        }
    )
    write_deltalake(path, row, mode="append")
    return int(DeltaTable(path).version())


def _trickle(
    paths: list[str], seconds: int, seed: int, announce: Any = None
) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    done = []
    start = time.monotonic()
    for n in range(seconds):
        path = rng.choice(paths)
        version = _commit(path, seed * 100_000 + n)
        if announce is not None:
            announce(path, version)
        done.append((path, version))
        time.sleep(max(0.0, start + n + 1 - time.monotonic()))
    return done


@dataclass(frozen=True)
class Settings:
    trigger: int
    settle: int
    idle: int
    trickle: int
    bound: float
    seed: int


class DiyQuery:
    """One DIY streaming query: a table's change feed MERGEd into one replica."""

    def __init__(self, source: str, target: str, checkpoint: Path) -> None:
        self.source, self.target, self.checkpoint = source, target, checkpoint
        self.batches: list[tuple[int, float]] = []
        self.query: Any = None

    def start(self, spark: SparkSession, trigger: int) -> None:
        def merge(batch: Any, batch_id: int) -> None:
            diy_merge(batch.sparkSession, self.target, batch, "id")
            self.batches.append((batch_id, time.time()))

        self.query = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "latest")
            .load(self.source)
            .writeStream.option("checkpointLocation", str(self.checkpoint))
            .foreachBatch(merge)
            .trigger(processingTime=f"{trigger} seconds")
            .start()
        )

    @property
    def started(self) -> bool:
        return self.query.lastProgress is not None

    @property
    def failed(self) -> bool:
        """Stopped by an error, or not started within :data:`STARTUP_BOUND_S`."""
        return not self.query.isActive or not self.started

    def reached(self, version: int) -> bool:
        return any(v >= version for v, _ in _diy_visible(self.checkpoint, self.batches))

    def visible_at(self, version: int) -> float:
        seen = [at for v, at in _diy_visible(self.checkpoint, self.batches) if v >= version]
        return min(seen, default=float("inf"))

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


class Measured:
    """What one side measured."""

    def __init__(self) -> None:
        self.startup_s = 0.0
        self.idle_cpu = 0.0
        self.idle_fs_per_min = 0.0
        self.idle_table_fs_per_min = 0.0
        self.idle_batches = 0
        """Micro-batches run over the idle window (every query's, for DIY)."""
        self.p50 = float("nan")
        self.p95 = float("nan")
        self.kept_up = False
        self.memory_mib = 0.0
        self.failed = 0
        """Queries that failed (DIY), or jobs in error (lakeprop)."""
        self.equal = False


def _idle_cpu(spark: SparkSession, seconds: int, settle: int) -> float:
    """Cores the driver (the JVM and this process) used over ``seconds``, after ``settle``."""
    time.sleep(settle)
    pid = jvm_pid(spark)
    cpu = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu) / seconds


def _without_jobs(
    spark: SparkSession, workdir: Path, bootstrap_servers: str, settings: Settings
) -> float:
    """The idle CPU of a service with no job at all, configured as the measured one."""
    app = PropagationApp(spark, _config(workdir, bootstrap_servers, settings))
    query = app.start()
    try:
        return _idle_cpu(spark, settings.idle, settings.settle)
    finally:
        app.stop_query(query)
        app.shutdown()


def _config(workdir: Path, bootstrap_servers: str, settings: Settings) -> AppConfig:
    """The service of this benchmark: commit notifications on, a tick as long as the
    DIY queries' trigger."""
    config = app_config(workdir, bootstrap_servers, workers=2)
    notifications = replace(
        config.notifications,
        enabled=True,
        topic=f"{config.kafka.topic}.commits",
        sweep_interval=3600.0,
    )
    return replace(config, tick_interval=float(settings.trigger), notifications=notifications)


def _idle(
    spark: SparkSession,
    settings: Settings,
    own: str,
    tables: str,
    batches: Callable[[], int],
    out: Measured,
) -> None:
    """Cores used, micro-batches run (``batches`` counts them so far), and
    file-system operations per minute on the side's ``own`` files and on its
    ``tables`` alone, over ``idle`` seconds of quiet after ``settle`` more (the
    first minutes after a start still compile and flush what it left); the
    operations over as long again, traced (the tracer slows what it traces, so
    the CPU is measured without it)."""
    pid = jvm_pid(spark)
    time.sleep(settings.settle)
    before = batches()
    out.idle_cpu = _idle_cpu(spark, settings.idle, 0)
    out.idle_batches = batches() - before
    everything, on_tables = traced_operations([pid, os.getpid()], settings.idle, own, tables)
    out.idle_fs_per_min = everything * 60 / settings.idle
    out.idle_table_fs_per_min = on_tables * 60 / settings.idle


def _diy(
    spark: SparkSession, workdir: Path, paths: list[str], k: int, settings: Settings
) -> Measured:
    out = Measured()
    queries = []
    for path in paths:
        for r in range(k):
            target = f"{path}_r{r}"
            spark.read.format("delta").load(path).write.format("delta").save(target)
            checkpoint = workdir / "diy" / "checkpoints" / f"{Path(path).name}_r{r}"
            queries.append(DiyQuery(path, target, checkpoint))
    started = time.monotonic()
    for query in queries:
        query.start(spark, settings.trigger)
    try:
        # every query has run a micro-batch, or failed (a driver too small for them all)
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: all(q.started or not q.query.isActive for q in queries),
                STARTUP_BOUND_S,
                0.5,
            )
        out.startup_s = time.monotonic() - started
        _idle(
            spark,
            settings,
            str(workdir / "diy"),
            str(Path(paths[0]).parent),
            lambda: sum(len(q.batches) for q in queries),
            out,
        )
        commits = _trickle(paths, settings.trickle, settings.seed)

        def reached() -> bool:
            return all(
                q.reached(v) for p, v in commits for q in queries if q.source == p and not q.failed
            )

        out.kept_up = eventually(reached, settings.bound + settings.trigger)
        alive = [q for q in queries if not q.failed]
        latencies = [
            q.visible_at(version) - _commit_time(path, version)
            for path, version in commits
            for q in alive
            if q.source == path
        ]
        out.p50, out.p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
        out.failed = len(queries) - len(alive)
        out.kept_up = out.kept_up and out.p95 <= settings.bound and not out.failed
        out.memory_mib = live_mib(spark)
        # the check compares whole tables: a side that fell behind gets to catch up first
        eventually(reached, CATCH_UP_BOUND_S)
    finally:
        for query in queries:
            query.stop()
    out.equal = all(  # the queries that ran: what failed is counted apart
        same_rows(
            spark.read.format("delta").load(q.target), spark.read.format("delta").load(q.source)
        )
        for q in alive
    )
    return out


def _read(spark: SparkSession, path: str) -> Any:
    return spark.read.format("delta").load(path)


def _lakeprop(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    paths: list[str],
    k: int,
    settings: Settings,
) -> Measured:
    out = Measured()
    config = _config(workdir, bootstrap_servers, settings)
    config = replace(
        config, tables=replace(config.tables, warehouse=str(Path(paths[0]).parents[1]))
    )
    client = LakepropClient(config.kafka, config.state, spark, notifications=config.notifications)
    client.register_jobs(
        [
            (JobKey(1, "db", Path(p).name, f"r{r}"), {"iteration": {"consumer": REPLICA}})
            for p in paths
            for r in range(k)
        ]
    )
    app = PropagationApp(spark, config)
    started = time.monotonic()
    query = app.start()
    try:
        wait_until(lambda: all(r.watermark is not None for r in app.catalog.rows()), 3600, 0.5)
        out.startup_s = time.monotonic() - started
        _idle(
            spark,
            settings,
            str(workdir),
            str(Path(paths[0]).parent),
            lambda: app.runner.batches,
            out,
        )

        def announce(path: str, version: int) -> None:
            client.notify_commit("db", Path(path).name, version)

        commits = _trickle(paths, settings.trickle, settings.seed, announce)
        latest: dict[str, int] = {}
        for path, version in commits:
            latest[Path(path).name] = max(latest.get(Path(path).name, 0), version)

        def reached() -> bool:
            return all((r.watermark or -1) >= latest.get(r.table, -1) for r in app.catalog.rows())

        out.kept_up = eventually(reached, settings.bound + 5)
        latencies = []
        for path, version in commits:
            for r in range(k):
                seen = [at for v, at in _lakeprop_visible(f"{path}_r{r}") if v >= version]
                visible = min(seen) if seen else float("inf")
                latencies.append(visible - _commit_time(path, version))
        out.p50, out.p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
        out.failed = sum(r.job_state == "error" for r in app.catalog.rows())
        out.kept_up = out.kept_up and out.p95 <= settings.bound and not out.failed
        out.memory_mib = live_mib(spark)
        eventually(reached, CATCH_UP_BOUND_S)
    finally:
        app.stop_query(query)
        app.shutdown()
        client.close()
    out.equal = all(
        same_rows(spark.read.format("delta").load(f"{p}_r{r}"), spark.read.format("delta").load(p))
        for p in paths
        for r in range(k)
    )
    return out


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    tables: int = 50,
    k: int = 4,
    trigger: int = 5,
    idle: int = 60,
    trickle: int = 60,
    settle: int = 120,
    bound: int = 10,
    seed: int = 1,
) -> Result:
    ours_paths = sources(spark, workdir / "lakeprop" / "warehouse", tables)
    theirs_paths = sources(spark, workdir / "diy" / "warehouse", tables)
    settings = Settings(trigger, settle, idle, trickle, bound, seed)
    without_jobs = _without_jobs(spark, workdir / "empty", bootstrap_servers, settings)
    spark_alone = _idle_cpu(spark, idle, settle)
    ours = _lakeprop(spark, workdir / "lakeprop", bootstrap_servers, ours_paths, k, settings)
    theirs = _diy(spark, workdir, theirs_paths, k, settings)
    return Result(
        TITLE,
        {
            "tables": tables,
            "k": k,
            "queries": tables * k,
            "trigger_s": trigger,
            "idle_s": idle,
            "settle_s": settle,
            "trickle_s": trickle,
        },
        [
            Figure("start-up", "s", ours.startup_s, theirs.startup_s),
            Figure("idle driver CPU", "cores", ours.idle_cpu, theirs.idle_cpu),
            Figure("idle micro-batches", "count", ours.idle_batches, theirs.idle_batches),
            Figure(
                "idle driver CPU with no job (baseline: Spark alone)",
                "cores",
                without_jobs,
                spark_alone,
            ),
            Figure(
                "idle file-system operations",
                "per_min",
                ours.idle_fs_per_min,
                theirs.idle_fs_per_min,
            ),
            Figure(
                "idle file-system operations on tables",
                "per_min",
                ours.idle_table_fs_per_min,
                theirs.idle_table_fs_per_min,
            ),
            Figure("trickle commit to sink p50", "s", ours.p50, theirs.p50),
            Figure("trickle commit to sink p95", "s", ours.p95, theirs.p95),
            Figure("kept up with the trickle", "count", int(ours.kept_up), int(theirs.kept_up)),
            Figure("queries or jobs failed", "count", ours.failed, theirs.failed),
            Figure("driver memory", "MiB", ours.memory_mib, theirs.memory_mib),
        ],
        {"lakeprop_replicas_equal": ours.equal, "diy_replicas_equal": theirs.equal},
        baseline=f"{tables * k} DIY readChangeFeed queries in one driver, {trigger} s trigger",
    )
