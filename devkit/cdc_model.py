"""A pure-Python model of ``auto_cdc``: change events applied in sequence order.

The oracle of the consumer's property tests. It applies every event, sorted by
its sequence, one at a time, the simplest way the semantics can be said; the
consumer computes the same result incrementally in Spark, from whatever part of
the events each iteration sees. A test compares them whole.

* SCD type 1: per key, the row the events leave. An upsert replaces the row
  (with ``ignore_null_updates``, a NULL keeps the row's value); a delete removes
  it; a truncate removes every row. Each row carries ``__SEQUENCE`` (the
  sequence of the last upsert applied to it) and, with ``ignore_null_updates``,
  ``__COLUMN_SEQUENCES`` (per column, the sequence its value came from).
* SCD type 2: per key, its versions ``[__START_AT, __END_AT)``. An upsert that
  changes a tracked column closes the current version and opens one; one that
  changes only untracked columns updates the current version in place; a delete
  closes the current version.

At one sequence a truncate comes before the upserts: it removes the rows whose
sequence is lower than its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

UPSERT, DELETE, TRUNCATE = "upsert", "delete", "truncate"


@dataclass(frozen=True)
class Event:
    key: tuple[Any, ...]
    seq: Any
    """Comparable: a number, or a tuple for several sequence columns."""
    kind: str
    values: tuple[tuple[str, Any], ...] = ()
    """The event's columns (not the keys), as (name, value) pairs."""

    def get(self, column: str) -> Any:
        return dict(self.values).get(column)


class ConflictError(ValueError):
    """Two different events with the same key and sequence."""


def distinct(events: Iterable[Event]) -> list[Event]:
    """Identical events once; raise on two different events of one key and sequence."""
    seen: dict[tuple[Any, Any], Event] = {}
    out = []
    for event in events:
        slot = (("truncate",), event.seq) if event.kind == TRUNCATE else (event.key, event.seq)
        earlier = seen.get(slot)
        if earlier is None:
            seen[slot] = event
            out.append(event)
        elif earlier != event:
            raise ConflictError(f"key {event.key} has two events at sequence {event.seq}")
    return out


def ordered(events: Iterable[Event]) -> list[Event]:
    rank = {TRUNCATE: 0, DELETE: 1, UPSERT: 1}
    return sorted(distinct(events), key=lambda e: (e.seq, rank[e.kind]))


@dataclass
class Scd1:
    columns: Sequence[str]
    ignore_null_updates: bool = False
    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    def apply(self, events: Iterable[Event]) -> Scd1:
        for e in ordered(events):
            if e.kind == TRUNCATE:
                self.rows = {k: r for k, r in self.rows.items() if r["__SEQUENCE"] >= e.seq}
            elif e.kind == DELETE:
                self.rows.pop(e.key, None)
            else:
                self._upsert(e)
        return self

    def _upsert(self, e: Event) -> None:
        old = self.rows.get(e.key)
        row: dict[str, Any] = {"__SEQUENCE": e.seq}
        sequences: dict[str, Any] = {}
        for column in self.columns:
            value = e.get(column)
            if self.ignore_null_updates and value is None and old is not None:
                row[column] = old[column]
                if old["__COLUMN_SEQUENCES"].get(column) is not None:
                    sequences[column] = old["__COLUMN_SEQUENCES"][column]
            else:
                row[column] = value
                if value is not None:
                    sequences[column] = e.seq
        if self.ignore_null_updates:
            row["__COLUMN_SEQUENCES"] = sequences
        self.rows[e.key] = row

    def table(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The target's rows, key columns first."""
        return [{**dict(zip(keys, k, strict=True)), **r} for k, r in sorted(self.rows.items())]


@dataclass
class Scd2:
    columns: Sequence[str]
    tracked: Sequence[str]
    """The columns whose change opens a new version (default: all of ``columns``)."""
    ignore_null_updates: bool = False
    versions: dict[tuple[Any, ...], list[dict[str, Any]]] = field(default_factory=dict)

    def apply(self, events: Iterable[Event]) -> Scd2:
        for e in ordered(events):
            if e.kind == TRUNCATE:
                raise ValueError("SCD type 2 has no truncates")
            history = self.versions.setdefault(e.key, [])
            current = history[-1] if history and history[-1]["__END_AT"] is None else None
            if e.kind == DELETE:
                if current is not None:
                    current["__END_AT"] = e.seq
                continue
            values = {
                c: current[c]
                if self.ignore_null_updates and current is not None and e.get(c) is None
                else e.get(c)
                for c in self.columns
            }
            if current is not None and all(values[c] == current[c] for c in self.tracked):
                current.update(values)  # untracked columns change in place
                continue
            if current is not None:
                current["__END_AT"] = e.seq
            history.append({**values, "__START_AT": e.seq, "__END_AT": None})
        return self

    def table(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        return [
            {**dict(zip(keys, k, strict=True)), **v}
            for k, history in sorted(self.versions.items())
            for v in history
        ]


def events_of_rows(
    rows: Iterable[Mapping[str, Any]],
    keys: Sequence[str],
    sequence: Sequence[str],
    columns: Sequence[str],
    kind_of: Any,
) -> list[Event]:
    """Events from rows of an event table: ``kind_of(row)`` says upsert, delete or
    truncate; one sequence column gives a scalar, several a tuple."""
    out = []
    for row in rows:
        seq = row[sequence[0]] if len(sequence) == 1 else tuple(row[s] for s in sequence)
        kind = kind_of(row)
        values = () if kind != UPSERT else tuple((c, row.get(c)) for c in columns)
        out.append(Event(tuple(row[k] for k in keys), seq, kind, values))
    return out
