"""What each fuzzed job's target must hold at a source version, computed from scratch.

Every model reads the source as of the version the job reached (time travel)
and says what the target holds then: a replica is the source, a secondary
index its indexed and key columns, an aggregate view the GROUP BY, a full-text
index the postings of every row, a vector index every non-NULL vector in the
list of its nearest live centroid, an ``auto_cdc`` table the rows (SCD type 1)
or the history of states, one version per change of a key (SCD type 2), a
change feed the rows its messages fold to. Results are compared whole:
sorted rows of plain values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from devkit.cdc_model import DELETE, UPSERT, Event, Scd2
from devkit.expected import AGGREGATE_COLUMNS, aggregated
from lakeprop.consumers.fulltext_index import Tokenizer, postings
from lakeprop.consumers.vector_index import ivf, live_postings

Rows = list[tuple[Any, ...]]
State = dict[int, dict[str, Any]]
"""A source version's rows by key."""


def plain(value: Any) -> Any:
    """A collected value as a hashable, comparable one."""
    if isinstance(value, list):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, plain(v)) for k, v in value.items()))
    return value


def rows_of(frame: DataFrame, columns: Sequence[str]) -> Rows:
    return sorted(
        (tuple(plain(r[c]) for c in columns) for r in frame.select(*columns).collect()), key=repr
    )


@dataclass(frozen=True)
class Check:
    """One job's comparison: the expected and actual rows, and what they are of."""

    job: str
    version: int
    expected: Rows
    actual: Rows

    def differences(self) -> str | None:
        if self.expected == self.actual:
            return None
        missing = [r for r in self.expected if r not in self.actual][:5]
        extra = [r for r in self.actual if r not in self.expected][:5]
        return (
            f"{self.job} at source version {self.version}: {len(self.expected)} rows "
            f"expected, {len(self.actual)} found; missing {missing}; unexpected {extra}"
        )


Target = Callable[[str], DataFrame]
"""Reads a job's table by suffix (``""`` for the target itself)."""


def replica(source: DataFrame, target: Target, columns: Sequence[str]) -> tuple[Rows, Rows]:
    return rows_of(source, columns), rows_of(target(""), columns)


def secondary_index(source: DataFrame, target: Target) -> tuple[Rows, Rows]:
    return rows_of(source, ["grp", "id"]), rows_of(target(""), ["grp", "id"])


def aggregate_view(source: DataFrame, target: Target) -> tuple[Rows, Rows]:
    columns = ["grp", *AGGREGATE_COLUMNS]
    return rows_of(aggregated(source, ["grp"], "v"), columns), rows_of(target(""), columns)


def fulltext_index(source: DataFrame, target: Target) -> tuple[Rows, Rows]:
    columns = ["term", "id", "field", "tf", "positions"]
    expected = postings(source, ["id"], ["name"], Tokenizer.from_options(None))
    return rows_of(expected, columns), rows_of(target(""), columns)


def vector_index(source: DataFrame, target: Target) -> tuple[Rows, Rows]:
    """The live version's postings are the non-NULL vectors, each in its nearest list."""
    live = target("__index").where("live").select("index_version", "metric").first()
    postings = live_postings(target(""), target("__index"), "emb")
    if live is None or postings is None:
        return rows_of(source.where("emb IS NOT NULL"), ["id", "emb"]), []
    number, metric = live["index_version"], live["metric"]
    centroids = np.asarray(
        [
            r["centroid"]
            for r in target("__centroids")
            .where(F.col("index_version") == number)
            .orderBy("list_id")
            .collect()
        ],
        dtype=np.float32,
    )
    found = postings.collect()
    actual = sorted(((r["id"], plain(r["emb"])) for r in found), key=repr)
    misplaced = [
        (r["id"], "list", r["list_id"])
        for r in found
        if len(centroids)
        and int(ivf.assign(np.asarray([r["emb"]], np.float32), centroids, metric)[0])
        != r["list_id"]
    ]
    return rows_of(source.where("emb IS NOT NULL"), ["id", "emb"]), actual + misplaced


def auto_cdc_scd1(source: DataFrame, target: Target, columns: Sequence[str]) -> tuple[Rows, Rows]:
    return rows_of(source, columns), rows_of(target(""), columns)


def auto_cdc_scd2(
    states: Mapping[int, State], start: int, version: int, target: Target, columns: Sequence[str]
) -> tuple[Rows, Rows]:
    """SCD type 2 of a table source sequenced by commit version: from the snapshot at
    ``start``, one event per key per version whose state changed."""
    values = [c for c in columns if c != "id"]
    events = [
        Event((k,), start, UPSERT, tuple((c, r.get(c)) for c in values))
        for k, r in states[start].items()
    ]
    for version_now in range(start + 1, version + 1):
        before, after = states[version_now - 1], states[version_now]
        for key in before.keys() | after.keys():
            if key not in after:
                events.append(Event((key,), version_now, DELETE))
            elif before.get(key) != after[key]:
                row = after[key]
                events.append(
                    Event((key,), version_now, UPSERT, tuple((c, row.get(c)) for c in values))
                )
    model = Scd2(values, values).apply(events).table(["id"])
    shown = [*columns, "__START_AT", "__END_AT"]
    expected = sorted((tuple(plain(r.get(c)) for c in shown) for r in model), key=repr)
    return expected, rows_of(target(""), shown)


def kafka_changefeed(
    source: DataFrame, messages: Sequence[tuple[str, str]], columns: Sequence[str]
) -> tuple[Rows, Rows]:
    """The messages folded per key, in order: the row of its last insert, update or
    snapshot message; none after a delete."""
    folded: dict[str, dict[str, Any] | None] = {}
    for key, value in messages:
        message = json.loads(value)
        folded[key] = None if message["op"] == "delete" else message["row"]
    actual = sorted(
        (tuple(plain(r.get(c)) for c in columns) for r in folded.values() if r is not None),
        key=repr,
    )
    return rows_of(source, columns), actual
