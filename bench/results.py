"""Benchmark results as data: one JSON record per figure, in committed files.

``make bench`` appends to ``bench/results/<date>-<machine>.jsonl``. Every
record carries what it takes to trace and compare it: the run (id, time,
commit), the machine (a label, cores, memory), the stack (Python, PySpark,
Spark, delta-spark, the Delta and Kafka connector jars, the broker), the size
preset and the benchmark's own sizes, lakeprop's value and the baseline's.
``bench/report.py`` turns the files into the docs' benchmarks page.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

_JAR = re.compile(r"(?P<artifact>[A-Za-z0-9_.-]+?)-(?P<version>\d[\w.]*)\.jar$")


def machine_label() -> str:
    """``LAKEPROP_BENCH_MACHINE``, else cores and memory (``2cpu-23gib``): host
    names of throw-away machines say nothing."""
    label = os.environ.get("LAKEPROP_BENCH_MACHINE")
    if label:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", label)
    return f"{os.cpu_count()}cpu-{_memory_gib()}gib"


def _memory_gib() -> int:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
    return round(pages / 2**30)


def _package(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def jar_versions(jars: Iterable[str], packages: Iterable[str] = ()) -> dict[str, str]:
    """The Delta and Kafka connector artifacts among ``jars`` (paths) and
    ``packages`` (Maven coordinates ``group:artifact:version``), by artifact."""
    found: dict[str, str] = {}
    named = [(m["artifact"], m["version"]) for m in map(_JAR.search, map(_name, jars)) if m]
    named += [tuple(p.split(":")[1:3]) for p in packages if p.count(":") == 2]  # type: ignore[misc]
    for artifact, release in named:
        if artifact.startswith(("delta-spark_", "spark-sql-kafka")):
            found[artifact] = release
    return found


def _name(path: str) -> str:
    return Path(path).name


def broker_version(classpath: str) -> str | None:
    """The Kafka broker's version, from its classpath (the ``kafka_2.13`` jar)."""
    for entry in classpath.split(os.pathsep):
        match = _JAR.search(Path(entry).name)
        if match and match["artifact"] == "kafka_2.13":
            return match["version"]
    return None


def stack(spark: SparkSession, broker_classpath: str = "") -> dict[str, Any]:
    """The versions a run measured."""
    conf = spark.sparkContext.getConf()
    jars = (conf.get("spark.jars") or "").split(",")
    packages = (conf.get("spark.jars.packages") or "").split(",")
    return {
        "python": platform.python_version(),
        "pyspark": _package("pyspark"),
        "spark": spark.version,
        "delta_spark": _package("delta-spark"),
        "jars": jar_versions(jars, packages),
        "kafka_broker": broker_version(broker_classpath),
        "deltalake": _package("deltalake"),
    }


def git_commit() -> str | None:
    """The checkout's commit, ``+dirty`` when tracked code (not the recorded figures)
    differs from it: the figures are then of code no commit holds."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        changed = subprocess.run(
            [
                *("git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"),
                *("--", ".", ":!bench/results", ":!docs/benchmarks.md"),  # figures, not code
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    commit = out.stdout.strip()
    return (f"{commit}+dirty" if changed.stdout.strip() else commit) or None


def run_context(spark: SparkSession, size: str, broker_classpath: str = "") -> dict[str, Any]:
    """What every record of one ``make bench`` run shares."""
    now = datetime.now(timezone.utc)
    return {
        "run_id": f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}",
        "at": now.isoformat(timespec="seconds"),
        "machine": machine_label(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "commit": git_commit(),
        "stack": stack(spark, broker_classpath),
        "size": size,
    }


def results_file(directory: Path = RESULTS, when: float | None = None) -> Path:
    """Today's file for this machine."""
    day = time.strftime("%Y-%m-%d", time.gmtime(when))
    return directory / f"{day}-{machine_label()}.jsonl"


def append(records: Iterable[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


def load(directory: Path = RESULTS) -> Iterator[dict[str, Any]]:
    """Every record of every results file, oldest file first."""
    for path in sorted(directory.glob("*.jsonl")):
        with open(path) as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)
