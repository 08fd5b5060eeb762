"""A join view evaluated in plain Python: the model the tests compare the consumer with.

Rows are dicts of column values; a table is a list of them. A view row is the
tuple of the rows it joins, one per source (``None`` where a LEFT join padded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lakeprop.consumers.join_view.plan import path_to
from lakeprop.consumers.join_view.query import Join, JoinQuery

Row = Mapping[str, Any]
Tables = Mapping[str, Sequence[Row]]
Combo = dict[str, Row | None]


def _matches(combo: Combo, join: Join, row: Row) -> bool:
    for earlier, mine in join.on:
        left = combo.get(earlier.alias)
        if left is None:  # padded: its columns are NULL, and NULL matches nothing
            return False
        a, b = left.get(earlier.name), row.get(mine.name)
        if a is None or b is None or a != b:
            return False
    return True


def evaluate(
    query: JoinQuery, tables: Tables, joins: Sequence[Join] | None = None, inner: bool = False
) -> list[Combo]:
    """The rows of the view over ``tables`` (by alias): with ``joins`` only those
    joins, and with ``inner`` every one of them as an inner join."""
    combos: list[Combo] = [{query.first.alias: row} for row in tables[query.first.alias]]
    for join in query.joins if joins is None else joins:
        joined: list[Combo] = []
        for combo in combos:
            found = [r for r in tables[join.source.alias] if _matches(combo, join, r)]
            joined += [{**combo, join.source.alias: r} for r in found]
            if not found and join.kind == "left" and not inner:
                joined.append({**combo, join.source.alias: None})
        combos = joined
    return combos


def affected_keys(
    query: JoinQuery,
    new: Tables,
    images: Mapping[str, Sequence[Row]],
    key: Sequence[str],
) -> set[tuple[Any, ...]]:
    """The first table's keys (columns ``key``) whose view rows a change can touch:
    step 1 of :mod:`lakeprop.consumers.join_view.plan`, with each source's
    pre- and post-images in ``images``."""
    first = query.first.alias
    found: set[tuple[Any, ...]] = set()
    for alias, changed in images.items():
        if alias == first:
            found |= {tuple(row[c] for c in key) for row in changed}
            continue
        tables = {**new, alias: changed}
        for combo in evaluate(query, tables, path_to(query, alias), inner=True):
            row = combo[first]
            assert row is not None
            found.add(tuple(row[c] for c in key))
    return found
