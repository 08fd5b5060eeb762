"""Running a job's iterations by hand: a snapshot, then tails over chosen ranges.

For tests that need every range boundary under their control (property tests of
a consumer): the engine's own :func:`~lakeprop.engine.iteration.run_iteration`,
with the job's spec, on real Delta tables, without the service or the broker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from lakeprop.config import TablesConfig
from lakeprop.engine.iteration import run_iteration
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberJob,
    TableRef,
)
from lakeprop.engine.native import NativeSettings
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.status import JoinedMark
from lakeprop.tables.resolve import Tables


class HandDriven:
    """One job on one source, its iterations run one at a time."""

    def __init__(
        self,
        spark: SparkSession,
        warehouse: str,
        key: JobKey,
        consumer: Mapping[str, Any],
        job_id: int = 1,
        small_rows: int = 100_000,
        native: NativeSettings | None = None,
    ) -> None:
        self.spark = spark
        self.tables = Tables(spark, TablesConfig(resolution="path", warehouse=warehouse))
        self.key = key
        self.spec = JobSpec.from_json({"iteration": {"consumer": dict(consumer)}})
        self.job_id = job_id
        self.small_rows = small_rows
        self.native = native
        """Run small tails natively as the service would (None: always on Spark)."""
        self.watermark: int | None = None
        self.joined: dict[str, JoinedMark] = {}
        """The versions of the tables it joins its target reflects, as the job's status
        would keep them (a test may set them back, as a crash before the catalog's
        commit would)."""

    def _run(self, kind: IterationKind, start: int | None, to: int) -> IterationResult:
        result = iterate(
            self.spark,
            self.tables,
            [(self.key, self.job_id, self.spec)],
            kind,
            start,
            to,
            small_rows=self.small_rows,
            native=self.native,
            joined_from=self.joined if kind is IterationKind.TAIL else {},
        )
        (outcome,) = result.members
        if outcome.error_code:
            raise IterationFailed(outcome.error_code, outcome.error_msg)
        self.watermark = to
        self.joined = dict(outcome.joined or {})
        return result

    def snapshot(self, version: int) -> IterationResult:
        return self._run(IterationKind.SNAPSHOT, None, version)

    def tail(self, to: int) -> IterationResult:
        assert self.watermark is not None, "a snapshot comes first"
        return self._run(IterationKind.TAIL, self.watermark, to)

    def path(self, suffix: str = "") -> str:
        options = self.spec.iteration.consumer.options
        table = options.get("target_table") or f"{self.key.table}_{self.key.job_name}"
        return self.tables.path_for(
            options.get("target_database") or self.key.database, table + suffix
        )

    def read(self, suffix: str = "", version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.path(suffix))


def iterate(
    spark: SparkSession,
    tables: Tables,
    jobs: list[tuple[JobKey, int, JobSpec]],
    kind: IterationKind,
    start: int | None,
    to: int,
    *,
    small_rows: int = 100_000,
    native: NativeSettings | None = None,
    joined_from: Mapping[str, JoinedMark] | None = None,
) -> IterationResult:
    """One iteration of ``jobs`` (key, job id, spec) of one source, from ``start`` (a
    tail) or a snapshot, to ``to``: the engine's own, in this thread (``joined_from``:
    what the jobs' statuses say of the tables they join)."""
    key = jobs[0][0]
    members = [
        MemberJob(Member((k, i), i, start), k, spec, dict(joined_from or {})) for k, i, spec in jobs
    ]
    plan = IterationPlan(
        TableRef(key.account_id, key.database, key.table),
        kind,
        to,
        tuple(m.member for m in members),
        0,
        time.time(),
    )
    spark.sparkContext.setJobGroup(plan.iteration_id, "hand-driven iteration")
    return run_iteration(
        spark, plan, members, tables, CancelToken(), small_rows=small_rows, native=native
    )


class IterationFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


def recorded_versions(path: str, job_id: int) -> dict[int, int]:
    """{sink version: source version} from the job's Delta transactions in the sink's log."""
    found: dict[int, int] = {}
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"].startswith(f"lakeprop-{job_id}-"):
                found[int(commit.stem)] = int(txn["version"])
    return found
