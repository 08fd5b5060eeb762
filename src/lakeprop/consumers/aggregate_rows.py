"""An aggregate view's groups moved by a small change set, in plain Python.

The arithmetic of ``aggregate_view``'s native path (:mod:`~lakeprop.consumers.
aggregate_view`), the same as its Spark path's, value for value: per group of
the change rows, the signed row count, per summed aggregate the signed sum and
non-NULL count, per extreme the least (``min``) or greatest (``max``) inserted
and removed value; then each group's new view row from its current one. An
extreme stays exact unless a value at or beyond it went away in the range: the
row says so (``recompute``) and the caller takes that group's extremes from the
source. Groups are Python tuples of the ``group_by`` values, so NULLs group
together as Spark's do (a float group column, whose NaN Spark groups too, is
refused before it gets here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROWS = "_lp_rows"
ARRIVES = ("insert", "update_postimage")
"""Change types that add a row to its group; the others take one away."""

Group = tuple[Any, ...]


def sum_column(alias: str) -> str:
    return f"_lp_sum_{alias}"


def count_column(alias: str) -> str:
    return f"_lp_n_{alias}"


@dataclass(frozen=True)
class Shape:
    """A view's ``group_by`` columns and ``aggregates`` (validated options)."""

    group_by: tuple[str, ...]
    aggregates: tuple[Mapping[str, Any], ...]

    @property
    def summed(self) -> list[Mapping[str, Any]]:
        """Aggregates kept as (sum, non-NULL count): sum, avg, count(column)."""
        return [a for a in self.aggregates if a["fn"] in ("sum", "avg", "count") and a["column"]]

    @property
    def extremes(self) -> list[Mapping[str, Any]]:
        return [a for a in self.aggregates if a["fn"] in ("min", "max")]


@dataclass
class Delta:
    """What one group's change rows add and take away."""

    rows: int = 0
    sums: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    inserted: dict[str, Any] = field(default_factory=dict)
    removed: dict[str, Any] = field(default_factory=dict)


def _pick(fn: str, a: Any, b: Any) -> Any:
    """``least``/``greatest`` of two values, NULLs ignored (Spark's, on non-floats)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b) if fn == "min" else max(a, b)


def deltas(shape: Shape, changes: Iterable[Mapping[str, Any]]) -> dict[Group, Delta]:
    """Per group, what the change rows (each with ``_change_type``) move."""
    found: dict[Group, Delta] = {}
    for row in changes:
        group = tuple(row[g] for g in shape.group_by)
        delta = found.setdefault(group, Delta())
        sign = 1 if row["_change_type"] in ARRIVES else -1
        delta.rows += sign
        for a in shape.summed:
            value = row[a["column"]]
            alias = a["as"]
            delta.sums[alias] = delta.sums.get(alias, 0) + sign * (0 if value is None else value)
            delta.counts[alias] = delta.counts.get(alias, 0) + sign * (value is not None)
        for a in shape.extremes:
            value, alias = row[a["column"]], a["as"]
            side = delta.inserted if sign == 1 else delta.removed
            side[alias] = _pick(a["fn"], side.get(alias), value)
    return found


def moved(
    shape: Shape, group: Group, delta: Delta, current: Mapping[str, Any] | None
) -> tuple[dict[str, Any], bool]:
    """The group's new view row (group columns, public aggregates, bookkeeping) from
    its ``current`` one (None: the group is new), and whether its extremes must be
    recomputed from the source."""
    now = current or {}
    row: dict[str, Any] = dict(zip(shape.group_by, group, strict=True))
    row[ROWS] = (now.get(ROWS) or 0) + delta.rows
    recompute = False
    for a in shape.summed:
        alias = a["as"]
        row[sum_column(alias)] = (now.get(sum_column(alias)) or 0) + delta.sums.get(alias, 0)
        row[count_column(alias)] = (now.get(count_column(alias)) or 0) + delta.counts.get(alias, 0)
    for a in shape.extremes:
        alias, fn = a["as"], a["fn"]
        candidate = _pick(fn, now.get(alias), delta.inserted.get(alias))
        removed = delta.removed.get(alias)
        if removed is not None:  # at or beyond the candidate: it may be the one gone
            beyond = candidate is None or (
                removed <= candidate if fn == "min" else removed >= candidate
            )
            recompute = recompute or beyond
        row[alias] = candidate
    for a in shape.aggregates:
        alias, fn = a["as"], a["fn"]
        if fn == "count":
            row[alias] = row[ROWS] if a["column"] is None else row[count_column(alias)]
        elif fn in ("sum", "avg"):
            total, n = row[sum_column(alias)], row[count_column(alias)]
            if n <= 0:
                row[alias] = None
            else:  # Spark divides a sum and a count as doubles
                row[alias] = total if fn == "sum" else float(total) / float(n)
    return row, recompute


def extremes_of(
    shape: Shape, rows: Iterable[Mapping[str, Any]], groups: Sequence[Group], named: bool = False
) -> dict[Group, dict[str, Any]]:
    """Per group of ``groups``, each extreme over the source ``rows`` of that group
    (a group without rows gets NULLs). With ``named`` the rows are per group already,
    each extreme under its alias."""
    wanted = set(groups)
    found: dict[Group, dict[str, Any]] = {g: {} for g in groups}
    for row in rows:
        group = tuple(row[g] for g in shape.group_by)
        if group not in wanted:
            continue
        for a in shape.extremes:
            alias = a["as"]
            value = row[alias if named else a["column"]]
            found[group][alias] = _pick(a["fn"], found[group].get(alias), value)
    return {g: {a["as"]: found[g].get(a["as"]) for a in shape.extremes} for g in groups}
