"""The operation fuzzer's pipeline workload: random chains of table consumers.

A chain is two or three jobs, each reading the target of the one before it, the
first the fuzzed source: replicas, ``auto_cdc`` tables (SCD type 1), aggregate
views, a replica of an aggregate view (keyed by its group), a secondary index at
the end. A step may carry a ``drop`` rule. After each sync every step has caught
up, in order, with its own source's latest version (the engine's own iterations,
one per step, on the chain's path), and every step's target is compared whole
with the model of the chain up to it: each step's transformation of the rows the
step before it holds, composed from the source at the version reached.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.fuzzing import models
from devkit.iterations import iterate
from lakeprop.engine.model import IterationKind
from lakeprop.engine.native import NativeSettings
from lakeprop.spec import JobKey, JobSpec
from lakeprop.tables.resolve import Tables

RULES = ("v >= 20", "length(name) > 8", "grp <> 1", "v % 3 <> 0")
"""The ``drop`` rules a step may carry (on the source's columns; a NULL name makes
the second one NULL, which drops too)."""
FIRST = ("replica", "cdc", "agg")
FOLLOWERS: dict[str, tuple[str, ...]] = {
    "replica": ("replica", "cdc", "agg", "index"),
    "cdc": ("replica", "agg", "index"),
    "agg": ("by_group",),
    "by_group": (),
    "index": (),
}
"""What may read each kind's target (an aggregate's rows are keyed by group)."""
ROW_LEVEL = ("replica", "cdc", "agg", "index")
"""The kinds whose source rows are the source's (a rule on its columns applies)."""
CONSUMERS: dict[str, tuple[str, dict[str, Any]]] = {
    "replica": ("replica", {"primary_key": ["id"]}),
    "by_group": ("replica", {"primary_key": ["grp"]}),
    "cdc": (
        "auto_cdc",
        {
            "keys": ["id"],
            "sequence_by": ["_commit_version"],
            "source_kind": "table",
            "stored_as_scd_type": 1,
        },
    ),
    "agg": ("aggregate_view", {"group_by": ["grp"], "aggregates": aggregates_of("v")}),
    "index": ("secondary_index", {"columns": ["grp"], "primary_key": ["id"]}),
}
"""Each kind's consumer type and options."""


@dataclass(frozen=True)
class Step:
    """One job of a chain: its kind and its drop rule (None: none)."""

    kind: str
    rule: str | None = None

    def __str__(self) -> str:
        return self.kind + (f"[drop unless {self.rule}]" if self.rule else "")

    def consumer(self) -> dict[str, Any]:
        consumer_type, options = CONSUMERS[self.kind]
        if self.rule is not None:
            options = {
                **options,
                "expectations": [{"name": "kept", "check": self.rule, "action": "drop"}],
            }
        return {"type": consumer_type, "options": options}

    def model(self, upstream: DataFrame) -> DataFrame:
        """The rows this step's target holds, of the rows its source holds."""
        kept = (
            upstream
            if self.rule is None
            else upstream.where(F.coalesce(F.expr(self.rule), F.lit(False)))
        )
        if self.kind == "agg":
            return aggregated(kept, ["grp"], "v").select("grp", *AGGREGATE_COLUMNS)
        if self.kind == "index":
            return kept.select("grp", "id")
        return kept


def draw_chain(rng: random.Random) -> list[Step]:
    """A chain of two or three steps, a rule on about half of them."""
    kinds, length = [rng.choice(FIRST)], rng.choice((2, 3))
    while len(kinds) < length and FOLLOWERS[kinds[-1]]:
        kinds.append(rng.choice(FOLLOWERS[kinds[-1]]))
    return [
        Step(k, rng.choice(RULES) if k in ROW_LEVEL and rng.random() < 0.5 else None) for k in kinds
    ]


def describe(chain: list[Step]) -> str:
    return "source -> " + " -> ".join(map(str, chain))


class ChainFailed(AssertionError):
    """A step of a fuzzed chain failed where the model says it must not."""


@dataclass
class ChainRun:
    """One chain's jobs on one path, caught up step by step, one iteration a step."""

    spark: SparkSession
    tables: Tables
    database: str
    source: str
    steps: list[Step]
    native: NativeSettings | None
    name: str
    first_id: int
    """Step ``k``'s job id is ``first_id + k``."""
    generation: int = 0
    watermarks: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.watermarks = [None] * len(self.steps)

    def key(self, k: int) -> JobKey:
        """Step ``k``'s job: it reads the source, or step ``k - 1``'s target."""
        return JobKey(0, self.database, self._table(k), f"{self.name}{k}")

    def _table(self, k: int) -> str:
        return self.source if k == 0 else f"{self._table(k - 1)}_{self.name}{k - 1}"

    def _target_path(self, k: int) -> str:
        return self.tables.path_for(self.database, self._table(k + 1))

    def resync(self) -> None:
        """The source was re-created: every step starts again from a snapshot, as
        the service's error says to (the re-created table may lack a column an
        earlier one had, which a downstream tail refuses)."""
        self.generation += 1
        self.watermarks = [None] * len(self.steps)

    def sync(self, version: int) -> None:
        for k, step in enumerate(self.steps):
            to = version if k == 0 else self.tables.probe.latest_version(self._target_path(k - 1))
            assert to is not None
            start = self.watermarks[k]
            if start is not None and start >= to:
                continue
            consumer = step.consumer()
            if self.generation:
                consumer["generation"] = self.generation
            spec = JobSpec.from_json({"iteration": {"consumer": consumer}})
            kind = IterationKind.SNAPSHOT if start is None else IterationKind.TAIL
            result = iterate(
                self.spark,
                self.tables,
                [(self.key(k), self.first_id + k, spec)],
                kind,
                start,
                to,
                native=self.native,
            )
            failed = [m for m in result.members if not m.ok]
            if failed:
                raise ChainFailed(
                    f"chain {self.name} step {k} ({step}) {kind.value} to {to} ({result.path}): "
                    + "; ".join(f"[{m.error_code}] {m.error_msg}" for m in failed)
                )
            self.watermarks[k] = to

    def compare(self, source: DataFrame, version: int) -> str | None:
        """Each step's target against the chain's model up to it: the first
        difference, or None."""
        model = source
        for k, step in enumerate(self.steps):
            model = step.model(model)
            columns = model.columns
            target = self.spark.read.format("delta").load(self._target_path(k))
            check = models.Check(
                f"chain {self.name} step {k} ({step})",
                version,
                models.rows_of(model, columns),
                models.rows_of(target, columns),
            )
            problem = check.differences()
            if problem is not None:
                return problem
        return None
