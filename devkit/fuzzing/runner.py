"""The operation fuzzer: random sequences of real Delta operations on a source, every
consumer on both paths, every target compared whole with its model.

One sequence (:func:`run`): a seeded generator draws the source's shape and its
operations; after each one, some of the time, every job catches up with one
iteration per path, the engine's own (:func:`~lakeprop.engine.iteration.run_iteration`,
no service), and every target is compared with what its model says it holds at
the version reached. A re-created table is a new table: the jobs resync, as the
service's error for it says to. A failure names the seed and the operations;
:func:`shrink` finds the shortest list that still fails.
"""

from __future__ import annotations

import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from devkit.expected import aggregates_of
from devkit.fuzzing import models
from devkit.fuzzing.chains import ChainFailed, ChainRun, Step, describe, draw_chain
from devkit.fuzzing.source import Op, Shape, Source, draw
from devkit.iterations import iterate
from devkit.kafka import read_topic
from lakeprop.config import KafkaConfig, TablesConfig
from lakeprop.consumers.vector_index.builds import BUILDS
from lakeprop.engine.model import IterationKind
from lakeprop.engine.native import NativeSettings
from lakeprop.kafka import create_topic
from lakeprop.spec import JobKey, JobSpec
from lakeprop.tables.resolve import Tables

DATABASE, TABLE = "fz", "src"


def consumers(bootstrap_servers: str, topic: str) -> dict[str, dict[str, Any]]:
    """Every consumer type, one job each."""
    cdc = {"keys": ["id"], "sequence_by": ["_commit_version"], "source_kind": "table"}
    return {
        "replica": {"type": "replica", "options": {"primary_key": ["id"]}},
        "index": {
            "type": "secondary_index",
            "options": {"columns": ["grp"], "primary_key": ["id"]},
        },
        "text": {"type": "fulltext_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
        "agg": {
            "type": "aggregate_view",
            "options": {"group_by": ["grp"], "aggregates": aggregates_of("v")},
        },
        "vec": {
            "type": "vector_index",
            "options": {"key": ["id"], "vector": "emb", "lists": 3, "include": ["grp"]},
        },
        "cdc1": {"type": "auto_cdc", "options": {**cdc, "stored_as_scd_type": 1}},
        "cdc2": {"type": "auto_cdc", "options": {**cdc, "stored_as_scd_type": 2}},
        "feed": {
            "type": "kafka_changefeed",
            "options": {
                "topic": topic,
                "bootstrap_servers": bootstrap_servers,
                "primary_key": ["id"],
            },
        },
    }


NATIVE = ("replica", "index", "feed")
"""The jobs whose consumers have a native path: run a second time, on it (as one
iteration: a member without a native path would send it all to Spark); the feed
publishes to a topic of its own."""
NATIVE_ALONE = ("agg",)
"""Jobs with a native path that a source with deletion vectors keeps on Spark (an
aggregate view's recomputed extreme reads the source's rows, which delta-rs does
not read then): run in a native fleet of their own, so that the other native jobs
stay native on such a source."""
DRIVEN = ("cdc2",)
"""The jobs that read their tables' logs in the driver when the native path is on,
and iterate differently there: run a second time, in a fleet of their own with it
(``auto_cdc`` SCD 2 goes on from each key's open version; SCD 1's only cut there, an
empty tombstone table, is pinned by its own test)."""


class IterationFailed(AssertionError):
    """A member of a fuzzed iteration failed where the model says it must not."""


@dataclass
class Fleet:
    """The jobs of one path on one source, caught up together, one iteration a sync."""

    spark: SparkSession
    tables: Tables
    jobs: dict[str, JobSpec]
    native: NativeSettings | None
    suffix: str
    topic: str = ""
    """The topic its feed job publishes to, if it has one."""
    watermark: int | None = None
    generation: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    """How many of its tails ran on each path (``native``, ``spark``)."""
    ids: dict[str, int] = field(default_factory=dict)

    def key(self, name: str) -> JobKey:
        return JobKey(0, DATABASE, TABLE, f"{name}_{self.suffix}")

    def resync(self) -> None:
        """A new consumer generation for every job: the next sync is a snapshot."""
        self.generation += 1
        self.jobs = {
            name: JobSpec.from_json(
                {
                    "iteration": {
                        "consumer": {
                            **spec.iteration.consumer.to_json(),
                            "generation": self.generation,
                        }
                    }
                }
            )
            for name, spec in self.jobs.items()
        }
        self.watermark = None

    def sync(self, to: int) -> None:
        if self.watermark is not None and self.watermark >= to:
            return
        kind = IterationKind.SNAPSHOT if self.watermark is None else IterationKind.TAIL
        jobs = [(self.key(n), i, spec) for i, (n, spec) in enumerate(self.jobs.items(), start=1)]
        result = iterate(
            self.spark, self.tables, jobs, kind, self.watermark, to, native=self.native
        )
        if kind is IterationKind.TAIL:
            self.paths[result.path] += 1
        failed = [m for m in result.members if not m.ok]
        if failed:
            raise IterationFailed(
                f"{kind.value} to {to} ({result.path}): "
                + "; ".join(f"[{m.error_code}] {m.consumer_type}: {m.error_msg}" for m in failed)
            )
        self.watermark = to

    def table(self, name: str) -> Callable[[str], DataFrame]:
        path = self.tables.path_for(DATABASE, f"{TABLE}_{self.key(name).job_name}")
        return lambda suffix: self.spark.read.format("delta").load(path + suffix)


@dataclass
class Case:
    """One fuzz sequence: its seed, the source's shape, and its steps (an operation,
    and whether the jobs catch up after it)."""

    seed: int
    shape: Shape
    steps: list[tuple[Op, bool]]
    chains: tuple[tuple[str, tuple[Step, ...]], ...] = ()
    """The pipeline workload's chains, each with its path (``spark`` or ``native``)."""

    def describe(self) -> str:
        lines = [f"seed {self.seed}, source {self.shape}"]
        lines += [f"  chain on {path}: {describe(list(c))}" for path, c in self.chains]
        lines += [
            f"  {i}. {op}{'  -> sync' if sync else ''}" for i, (op, sync) in enumerate(self.steps)
        ]
        return "\n".join(lines)


WORKLOADS = ("consumers", "pipelines", "all")
"""What a fuzzer runs: every consumer on one source (both paths), random chains of
table consumers (:mod:`devkit.fuzzing.chains`, one on each path), or both."""


class Fuzzer:
    """Runs sequences against one warehouse directory, one broker."""

    def __init__(
        self,
        spark: SparkSession,
        workdir: Path,
        bootstrap_servers: str,
        workload: str = "consumers",
    ) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"workload is one of {WORKLOADS}, not {workload!r}")
        self.spark = spark
        self.workdir = workdir
        self.bootstrap_servers = bootstrap_servers
        self.workload = workload
        self.paths: Counter[tuple[str, str]] = Counter()
        """Tails per (fleet, path) over every sequence checked: the native fleet's
        must have taken the native path."""

    def generate(self, seed: int, operations: int) -> Case:
        """Draw a sequence, applying it as it is drawn (operations depend on the state)."""
        rng = random.Random(seed)
        shape = Shape.draw(rng)
        with self._source(shape) as source:
            steps: list[tuple[Op, bool]] = []
            for _ in range(operations):
                op = draw(rng, source, source.keys(), source.version() + 1)
                source.apply(op)
                sync = rng.random() < 0.5
                if op.name == "delete_file":  # its commits in a range of their own
                    if steps:
                        steps[-1] = (steps[-1][0], True)
                    sync = True
                steps.append((op, sync))
        if steps:
            steps[-1] = (steps[-1][0], True)
        chains: tuple[tuple[str, tuple[Step, ...]], ...] = ()
        if self.workload != "consumers":  # drawn apart: a seed's operations stay the same
            drawn = random.Random(f"chains-{seed}")
            chains = tuple((path, tuple(draw_chain(drawn))) for path in ("spark", "native"))
        return Case(seed, shape, steps, chains)

    def _source(self, shape: Shape) -> _Scratch:
        return _Scratch(self.spark, self.workdir / f"draw-{uuid.uuid4().hex[:8]}", shape)

    def check(self, sequence: Case) -> str | None:
        """Replay ``sequence`` with every job; the first difference or failure, or None."""
        root = self.workdir / f"run-{uuid.uuid4().hex[:8]}"
        tables = Tables(self.spark, TablesConfig(resolution="path", warehouse=str(root)))
        source = Source(self.spark, tables.path_for(DATABASE, TABLE), sequence.shape)
        topics = {path: f"fuzz-{path}-{uuid.uuid4().hex[:10]}" for path in ("spark", "native")}
        specs = {
            path: {
                n: JobSpec.from_json({"iteration": {"consumer": c}})
                for n, c in consumers(self.bootstrap_servers, topic).items()
            }
            for path, topic in topics.items()
        }
        native = {n: specs["native"][n] for n in NATIVE}
        fleets = [
            Fleet(self.spark, tables, specs["spark"], None, "spark", topics["spark"]),
            Fleet(self.spark, tables, native, NativeSettings(), "native", topics["native"]),
            Fleet(
                self.spark,
                tables,
                {n: specs["native"][n] for n in NATIVE_ALONE},
                NativeSettings(),
                "native_alone",
            ),
            Fleet(
                self.spark,
                tables,
                {n: specs["spark"][n] for n in DRIVEN},
                NativeSettings(),
                "driven",
            ),
        ]
        if self.workload == "pipelines":
            fleets = []
        chains = [
            ChainRun(
                self.spark,
                tables,
                DATABASE,
                TABLE,
                list(steps),
                NativeSettings() if path == "native" else None,
                "abcdefgh"[i],
                100 * (i + 1),
            )
            for i, (path, steps) in enumerate(sequence.chains)
        ]
        run = _Run(source, fleets, self.bootstrap_servers, chains)
        for topic in topics.values():
            create_topic(KafkaConfig(self.bootstrap_servers), topic, 2, {}, 30.0)
        try:
            source.create()
            run.record()
            for i, (op, sync) in enumerate(sequence.steps):
                before = source.table_id()
                source.apply(op)
                if not run.valid():
                    return None  # a shrunk list an operation no longer fits: not a failure
                run.record(recreated=source.table_id() != before)
                if sync:
                    problem = run.sync_and_compare()
                    if problem is not None:
                        return f"after step {i} ({op}): {problem}"
            return None
        except (IterationFailed, ChainFailed) as exc:
            return str(exc)
        finally:
            for fleet in fleets:
                self.paths.update({(fleet.suffix, p): n for p, n in fleet.paths.items()})
            BUILDS.wait(timeout=300)  # no background index build writes into a deleted tree
            shutil.rmtree(root, ignore_errors=True)


@dataclass
class _Scratch:
    """A throw-away source the generator draws against."""

    spark: SparkSession
    root: Path
    shape: Shape

    def __enter__(self) -> Source:
        self.source = Source(self.spark, str(self.root / "src"), self.shape)
        self.source.create()
        return self.source

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class _Run:
    """One replay: the source's states by version, the fleets and their feeds' topics."""

    def __init__(
        self,
        source: Source,
        fleets: list[Fleet],
        servers: str,
        chains: Sequence[ChainRun] = (),
    ) -> None:
        self.source = source
        self.fleets = fleets
        self.chains = chains
        self.servers = servers
        self.states: dict[int, models.State] = {}
        self.start = 0
        """The version of the spark fleet's last snapshot (where SCD type 2 begins)."""
        self.skip: dict[str, Counter[int]] = {}
        """Messages of each feed's topic per partition before the last resync."""

    def valid(self) -> bool:
        keys = self.source.keys()
        return len(keys) == len(set(keys))

    def record(self, recreated: bool = False) -> None:
        """The source's rows at every version it reached since the last look."""
        if recreated:
            for fleet in self.fleets:
                if fleet.topic and fleet.watermark is not None:  # its feed has messages
                    self.skip[fleet.topic] = Counter(
                        p for p, _, _ in read_topic(self.servers, fleet.topic)
                    )
            self.states.clear()
            for fleet in self.fleets:
                fleet.resync()
            for chain in self.chains:
                chain.resync()
        latest = self.source.version()
        for version in range(min(self.states, default=0), latest + 1):
            if version not in self.states:
                self.states[version] = {
                    r["id"]: {c: models.plain(r[c]) for c in r.asDict()}
                    for r in self.source.read(version).collect()
                }

    def sync_and_compare(self) -> str | None:
        version = self.source.version()
        if self.fleets and self.fleets[0].watermark is None:
            self.start = version
        for fleet in self.fleets:
            fleet.sync(version)
        for chain in self.chains:
            chain.sync(version)
        source = self.source.read(version)
        columns = list(self.source.columns())
        for fleet in self.fleets:
            for name in fleet.jobs:
                problem = self._compare(fleet, name, source, version, columns)
                if problem is not None:
                    return f"{fleet.suffix} path: {problem}"
        for chain in self.chains:
            problem = chain.compare(source, version)
            if problem is not None:
                return f"{'native' if chain.native else 'spark'} path: {problem}"
        return None

    def _compare(
        self, fleet: Fleet, name: str, source: DataFrame, version: int, columns: list[str]
    ) -> str | None:
        """Job ``name``'s target against its model: the difference, or None (a target
        without a column its model reads is a difference too)."""
        try:
            expected, actual = MODELS[name](
                self, fleet, source, fleet.table(name), version, columns
            )
        except AnalysisException as exc:
            return f"{name} at source version {version}: {str(exc).splitlines()[0]}"
        return models.Check(name, version, expected, actual).differences()

    def feed(self, topic: str) -> list[tuple[str, str]]:
        """A feed's messages since the last resync, by partition then offset."""
        seen: Counter[int] = Counter()
        skip = self.skip.get(topic, Counter())
        kept = []
        for partition, key, value in read_topic(self.servers, topic):
            seen[partition] += 1
            if seen[partition] > skip[partition]:
                kept.append(((key or b"").decode(), value.decode()))
        return kept


Model = Callable[
    [_Run, Fleet, DataFrame, models.Target, int, list[str]], tuple[models.Rows, models.Rows]
]
"""A job's (expected, actual) rows: the run, the job's fleet, the source at the version,
the job's tables, the version, the source's columns."""

MODELS: dict[str, Model] = {
    "replica": lambda run, fleet, source, target, version, columns: models.replica(
        source, target, columns
    ),
    "index": lambda run, fleet, source, target, version, columns: models.secondary_index(
        source, target
    ),
    "text": lambda run, fleet, source, target, version, columns: models.fulltext_index(
        source, target
    ),
    "agg": lambda run, fleet, source, target, version, columns: models.aggregate_view(
        source, target
    ),
    "vec": lambda run, fleet, source, target, version, columns: models.vector_index(source, target),
    "cdc1": lambda run, fleet, source, target, version, columns: models.auto_cdc_scd1(
        source, target, columns
    ),
    "cdc2": lambda run, fleet, source, target, version, columns: models.auto_cdc_scd2(
        run.states, run.start, version, target, columns
    ),
    "feed": lambda run, fleet, source, target, version, columns: models.kafka_changefeed(
        source, run.feed(fleet.topic), [c for c in columns if c != "emb"]
    ),
}
"""Each job's model (:data:`consumers`)."""


def shrink(sequence: Case, fails: Callable[[Case], bool], budget: float = 1800.0) -> Case:
    """The shortest sequence found that still ``fails``: steps removed one at a time,
    from the last, while the budget of seconds lasts."""
    deadline = time.monotonic() + budget
    steps = list(sequence.steps)
    i = len(steps) - 1
    while i >= 0 and time.monotonic() < deadline:
        candidate = steps[:i] + steps[i + 1 :]
        if candidate:
            candidate[-1] = (candidate[-1][0], True)
            trial = replace(sequence, steps=candidate)
            if fails(trial):
                steps = candidate
        i -= 1
    return replace(sequence, steps=steps)


def run(
    fuzzer: Fuzzer, seeds: Sequence[int], operations: int, shrink_budget: float = 0.0
) -> list[str]:
    """Every seed's sequence generated and checked; a report per failure (shrunk within
    ``shrink_budget`` seconds)."""
    failures = []
    for seed in seeds:
        sequence = fuzzer.generate(seed, operations)
        problem = fuzzer.check(sequence)
        if problem is None:
            continue
        if shrink_budget > 0:
            sequence = shrink(sequence, lambda s: fuzzer.check(s) is not None, shrink_budget)
            problem = fuzzer.check(sequence) or problem
        failures.append(f"{sequence.describe()}\n  fails: {problem}")
    return failures
