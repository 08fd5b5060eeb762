"""Expectations, evaluated: what a member's consumer gets once its rules have run.

The rules (:mod:`lakeprop.expectations`) run on the member's rows
before its consumer sees them, on the Spark path only (a tail of a job with
rules never goes the native way):

* one pass counts, per ``check`` rule, the rows going to the target (a
  snapshot's rows; a tail's inserts and post-images) that break it, and the
  rows every ``drop`` rule keeps (:class:`Tally`): on a tail, the pass that
  reads the change set, per commit version; on a snapshot, a Spark job;
* a ``unique`` rule reads the source at the range's end, narrowed to the keys
  the range wrote (a semi-join, bounded by the least and greatest key so that
  Delta skips the files outside); a snapshot checks the whole table;
* a broken ``fail`` rule raises :class:`~lakeprop.errors.ExpectationFailed`
  before anything is written;
* ``drop`` rules filter every change row, pre-images and deletes included: a
  row no ``drop`` rule lets in never reached the target, so its leaving must
  not reach it either, and an update whose new image is dropped leaves its
  pre-image alone, which the consumers read as the key leaving (the same rule
  as a key-changing update). The target holds exactly the source's rows that
  keep every ``drop`` rule.

The dropped rows go to ``<target>__quarantine`` after the consumer's write,
with whatever the consumer quarantined itself, in one write
(:func:`quarantine`, which states the contract).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakeprop.changes import boundable
from lakeprop.changes.feed import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from lakeprop.changes.latest import LEAVES
from lakeprop.consumers.base import ConsumerContext
from lakeprop.errors import ExpectationFailed
from lakeprop.expectations import DROP, FAIL, Expectation
from lakeprop.spec import target_table
from lakeprop.state.history import RuleCount
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import TableHandle

QUARANTINE = "__quarantine"
"""The suffix of the table next to the target that dropped rows go to."""
REASON, VERSION = "__reason", "__source_version"
"""The quarantine's columns beside the source's: the rules a row broke, and the
source version it came in (its commit's, or the snapshot's)."""
EXAMPLES = 5
"""Keys a ``fail`` error names."""


@dataclass(frozen=True)
class Guarded:
    """A member's rows after its rules: what its consumer gets, and what they found."""

    rows: DataFrame
    counts: tuple[RuleCount, ...]
    kept: int | None
    """Rows of ``rows`` when ``drop`` rules filtered some out (None: none)."""
    dropped: DataFrame | None
    """The dropped rows, as they go to the quarantine (None: none were)."""


@dataclass(frozen=True)
class Tally:
    """What one member's rules count in one pass over its rows: per ``check`` rule
    the rows going to the target that break it, the rows every ``drop`` rule keeps,
    all rows, and per ``unique`` rule the least and greatest first key column the
    rows write. On a tail these are aggregated per commit version in the pass that
    reads and stores the change set (:func:`~lakeprop.engine.changeset.read`), and
    a member sums its versions (:meth:`over`); so its rules cost no Spark job of
    their own. The aggregates' names start with ``prefix``, one per member."""

    rules: tuple[Expectation, ...]
    prefix: str = "_"
    snapshot: bool = False

    @property
    def going(self) -> Column:
        """The rows that go to the target: a snapshot's, a tail's inserts and post-images."""
        return F.lit(True) if self.snapshot else F.col(CHANGE_TYPE).isin(*LEAVES)

    @property
    def checks(self) -> list[Expectation]:
        return [r for r in self.rules if r.check is not None]

    @property
    def uniques(self) -> list[Expectation]:
        return [r for r in self.rules if r.unique]

    def holds(self) -> dict[str, Column]:
        return {r.name: F.coalesce(F.expr(r.check or ""), F.lit(False)) for r in self.checks}

    def kept_by_drops(self) -> Column:
        holds = self.holds()
        drops = [holds[r.name] for r in self.checks if r.action == DROP]
        return reduce(lambda a, b: a & b, drops, F.lit(True))

    def columns(self) -> list[Column]:
        """The aggregates, one pass over the rows (or over each commit version's)."""
        p, going, holds = self.prefix, self.going, self.holds()
        totals: list[Column] = [
            F.sum(F.when(going & ~holds[r.name], 1).otherwise(0)).alias(f"{p}{i}")
            for i, r in enumerate(self.checks)
        ]
        totals.append(F.sum(F.when(self.kept_by_drops(), 1).otherwise(0)).alias(f"{p}kept"))
        totals.append(F.count(F.lit(1)).alias(f"{p}all"))
        for j, rule in enumerate(self.uniques):  # the range of the keys written
            written = F.when(going & _present(rule.unique), F.col(rule.unique[0]))
            totals += [F.min(written).alias(f"{p}low{j}"), F.max(written).alias(f"{p}high{j}")]
        return totals

    def mergeable(self, schema: StructType) -> bool:
        """Whether the least and greatest key of each ``unique`` rule can be had from
        each version's (:meth:`over`): Python orders them as Spark does (the types
        :func:`~lakeprop.changes.boundable` names; not a collated string, a
        timestamp, a float with its NaN, a struct)."""
        types = {f.name.lower(): f.dataType for f in schema.fields}
        return all(
            (found := types.get(r.unique[0].lower())) is not None and boundable(found)
            for r in self.uniques
        )

    def over(self, per_version: Mapping[int, Mapping[str, Any]], start: int) -> dict[str, Any]:
        """The totals of the commit versions after ``start``, from their aggregates
        (sums added, the least of the lows, the greatest of the highs: only where
        :meth:`mergeable`), by the names :meth:`found` reads."""
        found: dict[str, Any] = {}
        for version, values in per_version.items():
            if version <= start:
                continue
            for name in self._names():
                value, had = values[self.prefix + name], found.get(name)
                if value is None:
                    found.setdefault(name, None)
                elif had is None:
                    found[name] = value
                elif name.startswith("low"):
                    found[name] = min(had, value)
                elif name.startswith("high"):
                    found[name] = max(had, value)
                else:
                    found[name] = had + value
        return {name: found.get(name) for name in self._names()}

    def _names(self) -> list[str]:
        names = [str(i) for i in range(len(self.checks))] + ["kept", "all"]
        return names + [f"{e}{j}" for j in range(len(self.uniques)) for e in ("low", "high")]

    def found(self, rows: DataFrame) -> dict[str, Any]:
        """The totals of ``rows``, in a Spark job of their own."""
        row = rows.agg(*self.columns()).collect()[0]
        return {name: row[self.prefix + name] for name in self._names()}


def guard(
    rules: Sequence[Expectation],
    rows: DataFrame,
    *,
    source: TableHandle,
    from_version: int | None,
    to_version: int,
    shown_keys: Sequence[str],
    counted: Mapping[str, Any] | None = None,
) -> Guarded:
    """Run ``rules`` on ``rows``: a tail's change rows after ``from_version``, or a
    snapshot's rows (``from_version`` None) at ``to_version``; raise
    :class:`ExpectationFailed` when a ``fail`` rule is broken. ``counted`` is the
    rules' :class:`Tally` of ``rows`` where the change set's read took it (else a
    Spark job takes it here)."""
    snapshot = from_version is None
    tally = Tally(tuple(rules), snapshot=snapshot)
    going, checks, uniques = tally.going, tally.checks, tally.uniques
    drops = [r for r in checks if r.action == DROP]
    holds = tally.holds()
    kept_by_drops = tally.kept_by_drops()
    found = tally.found(rows) if counted is None else counted
    counts = [RuleCount(r.name, r.action, int(found[str(i)] or 0)) for i, r in enumerate(checks)]
    span = _span(source, from_version, to_version)
    for rule, count in zip(checks, counts, strict=True):
        if rule.action == FAIL and count.failed:
            broken = rows.where(going & ~holds[rule.name])
            _fail(rule, count.failed, span, _examples(broken, shown_keys))
    for j, rule in enumerate(uniques):
        bounds = (found[f"low{j}"], found[f"high{j}"])
        counts.append(_unique(rule, rows, going, source, snapshot, to_version, bounds, span))
    kept = int(found["kept"] or 0)
    if kept == int(found["all"] or 0):
        return Guarded(rows, tuple(counts), None, None)
    if not any(c.failed for c in counts if c.action == DROP):  # a dropped row's leaving only
        return Guarded(rows.where(kept_by_drops), tuple(counts), kept, None)
    reasons = F.concat_ws(
        ", ", *[F.when(~holds[r.name], F.lit(r.name)) for r in drops]
    )  # concat_ws skips the NULLs of the rules a row keeps
    dropped = rows.where(going & ~kept_by_drops).withColumn(REASON, reasons)
    if snapshot:
        dropped = dropped.withColumn(VERSION, F.lit(to_version).cast("long"))
    else:
        dropped = dropped.withColumn(VERSION, F.col(COMMIT_VERSION).cast("long")).drop(
            CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP
        )
    return Guarded(rows.where(kept_by_drops), tuple(counts), kept, dropped)


def _present(columns: Sequence[str]) -> Column:
    """Every one of ``columns`` is set (a key with a NULL in it is no key)."""
    return reduce(lambda a, b: a & b, (F.col(c).isNotNull() for c in columns))


def _span(source: TableHandle, from_version: int | None, to_version: int) -> str:
    if from_version is None:
        return f"the snapshot of {source} at version {to_version}"
    return f"versions {from_version + 1}..{to_version} of {source}"


def _examples(broken: DataFrame, shown: Sequence[str]) -> list[dict[str, Any]]:
    columns = list(shown) or [c for c in broken.columns if not c.startswith("_")][:3]
    return [r.asDict() for r in broken.select(*columns).limit(EXAMPLES).collect()]


def _fail(rule: Expectation, count: int, span: str, examples: list[dict[str, Any]]) -> None:
    what = "key(s)" if rule.unique else "row(s)"
    raise ExpectationFailed(
        f"expectation {rule.name} ({rule.rule}) failed on {count} {what} of {span}, e.g. "
        f"{examples}; nothing of the range was written. Fix the source and resync the job, or "
        "update the job's expectations"
    )


def _unique(
    rule: Expectation,
    rows: DataFrame,
    going: Column,
    source: TableHandle,
    snapshot: bool,
    to_version: int,
    bounds: tuple[Any, Any],
    span: str,
) -> RuleCount:
    """Keys more than one source row holds at ``to_version``: among a snapshot's
    rows, or among those sharing a key the range wrote (``bounds``: the least and
    greatest first column of those keys; None when it wrote none)."""
    cols = list(rule.unique)
    present = _present(cols)
    if snapshot:
        held = rows.where(present)
    else:
        low, high = bounds
        if low is None:
            return RuleCount(rule.name, rule.action, 0)
        changed = rows.where(going & present).select(*cols).distinct()
        table = source.load(source.reader().option("versionAsOf", to_version))
        held = table.where(F.col(cols[0]).between(low, high)).join(changed, cols, "left_semi")
    shared = held.groupBy(*cols).count().where(F.col("count") > 1)
    keys = shared.count()
    if keys and rule.action == FAIL:
        _fail(rule, keys, span, [r.asDict() for r in shared.limit(EXAMPLES).collect()])
    return RuleCount(rule.name, rule.action, keys)


def quarantine(
    context: ConsumerContext, rows: Sequence[DataFrame], snapshot: bool, version: int
) -> None:
    """Write what a member's step set aside (the rows its rules dropped, and what its
    consumer quarantined) to ``<target>__quarantine``, in one write after the
    consumer's. The contract, for every consumer:

    * each dropped source row version is there once, over replays and crashes: a
      tail's append carries the job's transaction id and version, and a range
      applied again after a crash, longer than the first time, appends only the
      versions the table has not taken yet;
    * a snapshot replaces the table: a resync, a rule change (a new configuration)
      and a re-snapshot leave only what the new snapshot set aside. A replayed
      snapshot at the same version writes nothing again; at a later one it
      replaces what the first wrote.

    With nothing set aside a tail writes nothing, and a snapshot empties a table
    that is there."""
    database, table = target_table(context.key, context.options)
    handle = context.locate(database, f"{table}{QUARANTINE}")
    app_id = f"{context.txn_app_id}-expect"
    if not rows:
        if not (snapshot and handle.exists()):
            return
        rows = [handle.load(handle.reader()).limit(0)]
    frame = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), rows)
    if not snapshot and handle.exists():
        probe = DeltaLogProbe(context.spark)
        # the consumer's own id: what a consumer appended before the engine wrote for it
        taken = [probe.last_transaction(handle.location(), i) for i in (app_id, context.txn_app_id)]
        if any(t is not None for t in taken):
            frame = frame.where(F.col(VERSION) > max(t for t in taken if t is not None))
    writer = (
        frame.write.format("delta")
        .mode("overwrite" if snapshot else "append")
        .option("overwriteSchema" if snapshot else "mergeSchema", "true")
        .option("txnAppId", app_id)
        .option("txnVersion", str(version))
    )
    handle.save(writer)
