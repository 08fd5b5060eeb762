"""Scans of the service's Delta tables: the same queries run by Spark or by delta-rs.

A :class:`Query` is data (the columns wanted, conditions ANDed, an ordering,
and optionally a list column to explode), so the state reader
(:class:`~lakeprop.client.reads.StateReader`) writes each of its queries once
and any :class:`Scan` runs it:

* :class:`SparkScan` reads with a SparkSession (notebooks, metastore tables);
* :class:`LakeScan` reads with delta-rs and Arrow, no JVM (the CLI's read verbs);
* ``devkit.memscan.MemoryScan`` holds rows in memory (unit tests).

Rows come back as plain dictionaries, timestamps naive in local time as
Spark's ``collect`` gives them, so the two real scans answer alike.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lakeprop.errors import InvalidArgumentError
from lakeprop.storage import Storage

Row = dict[str, Any]

OPERATORS: Mapping[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    ">=": operator.ge,
    "in": lambda value, options: value in options,
    "is null": lambda value, _: value is None,
}
"""The comparisons a condition may make, as Python applies them."""


@dataclass(frozen=True)
class Condition:
    """``column <op> value``: ``==``, ``>=``, ``in`` (a tuple) or ``is null``."""

    column: str
    op: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise InvalidArgumentError(f"unknown condition operator {self.op!r}")

    def holds(self, row: Mapping[str, Any]) -> bool:
        value = row.get(self.column)
        if self.op != "is null" and value is None:
            return False  # SQL: a comparison with NULL is not true
        return OPERATORS[self.op](value, self.value)


def eq(column: str, value: Any) -> Condition:
    return Condition(column, "==", value)


@dataclass(frozen=True)
class Query:
    """What to read of one table."""

    columns: tuple[str, ...] | None = None
    """The columns wanted (None: all); columns the table lacks are left out."""
    where: tuple[Condition, ...] = ()
    order: tuple[str, ...] = ()
    explode: str | None = None
    """A list-of-structs column to explode: each element's fields become the row's,
    beside the other columns wanted (and ``where`` may name them)."""

    def matches(self, row: Mapping[str, Any]) -> bool:
        return all(c.holds(row) for c in self.where)

    def in_memory(self, rows: Sequence[Mapping[str, Any]]) -> list[Row]:
        """This query over rows held in Python (the reference the scans agree with)."""
        out: list[Row] = []
        for row in rows:
            kept = {k: v for k, v in row.items() if self.columns is None or k in self.columns}
            if self.explode is None:
                candidates = [kept]
            else:
                kept.pop(self.explode, None)
                candidates = [{**kept, **element} for element in row.get(self.explode) or ()]
            out += [c for c in candidates if self.matches(c)]
        return ordered(out, self.order)


def ordered(rows: list[Row], order: Sequence[str]) -> list[Row]:
    return sorted(rows, key=lambda r: tuple(r[c] for c in order)) if order else rows


class Scan(Protocol):
    """Reads Delta tables by path (the service's state always lives by path)."""

    def version(self, path: str) -> int | None:
        """The table's latest version, or None when there is no Delta table there."""

    def rows(self, path: str, query: Query) -> list[Row]:
        """The rows of the table's latest version that ``query`` selects."""


@dataclass
class SparkScan:
    """Runs queries with a SparkSession (built with ``getOrCreate`` when first needed)."""

    session: Any = None

    @property
    def spark(self) -> Any:
        if self.session is None:
            from pyspark.sql import SparkSession

            self.session = SparkSession.builder.getOrCreate()
        return self.session

    def version(self, path: str) -> int | None:
        from lakeprop.tables.hadoop import local_path
        from lakeprop.tables.probe import DeltaLogProbe

        # a local log is listed directly: no session needed, none started
        local = self.session is None and local_path(path) is not None
        spark: Any = None if local else self.spark
        return DeltaLogProbe(spark).latest_version(path)

    def rows(self, path: str, query: Query) -> list[Row]:
        from pyspark.sql import functions as F

        from lakeprop.state import store

        df = store.read_table(self.spark, path)
        if query.columns is not None:
            df = df.select(*[c for c in df.columns if c in query.columns])
        if query.explode is not None:
            others = [c for c in df.columns if c != query.explode]
            df = df.select(*others, F.explode(query.explode).alias("_e")).select(*others, "_e.*")
        for c in query.where:
            column = F.col(c.column)
            if c.op == "is null":
                df = df.where(column.isNull())
            elif c.op == "in":
                df = df.where(column.isin(list(c.value)))
            elif c.op == ">=":
                df = df.where(column >= F.lit(c.value))
            else:
                df = df.where(column == F.lit(c.value))
        if query.order:
            df = df.orderBy(*query.order)
        return [r.asDict(recursive=True) for r in df.collect()]


@dataclass
class LakeScan:
    """Runs queries with delta-rs and Arrow, in this process (no JVM)."""

    storage: Storage = field(default_factory=Storage)

    def __post_init__(self) -> None:
        from lakeprop.client.lake import Lake

        self.lake = Lake(self.storage)

    def version(self, path: str) -> int | None:
        if not self.lake.exists(path):
            return None
        return int(self.lake.open(path).version())

    def rows(self, path: str, query: Query) -> list[Row]:
        import pyarrow.dataset as ds

        # Equalities go down to Parquet; every condition is applied again in Python,
        # where timestamps are local time as Spark gives them (Arrow's are UTC).
        pushed = None
        if query.explode is None:
            for c in query.where:
                if c.op != ">=":
                    expression = _arrow(ds.field(c.column), c)
                    pushed = expression if pushed is None else pushed & expression
        columns = None if query.columns is None else [*query.columns]
        found = self.lake.rows(path, columns, pushed)
        return Query(None, query.where, query.order, query.explode).in_memory(found)


def _arrow(field: Any, condition: Condition) -> Any:
    if condition.op == "is null":
        return field.is_null()
    if condition.op == "in":
        return field.isin(list(condition.value))
    return field == condition.value
