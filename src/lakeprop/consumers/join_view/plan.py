"""How a join view goes from one set of source versions to the next: pure planning.

Every join of a view is ``INNER`` or ``LEFT`` and starts from the first table, so
each row of the view holds exactly one row of the first table. The view is
therefore the union, over the first table's keys, of each key's rows; and a key's
rows change only when a row they were or will be made of changes. An iteration
from versions ``v`` to ``v'`` (one per source) thus

1. finds the *affected* keys of the first table: for each source ``S`` with
   changes, the first table's keys whose rows join, through the joins that
   connect ``S`` to the first table, with any pre- or post-image of ``S``'s
   changes, every other table of that path read at its version in ``v'``
   (the first table's own changed keys are its images' keys);
2. recomputes the view for those keys alone, every source at its version in
   ``v'``, and replaces the target's rows of those keys with the result (a MERGE
   on the view's identity that leaves a row that came out the same untouched).

Step 1 is exact: take an old or new row of the view for a first-table key ``k``
that a change of ``S`` touches. Walk its path from the first table towards ``S``;
the first table of the path whose row changed is either the first table itself
(then ``k`` is among its changed keys) or some ``T``, whose pre- or post-image
joins with rows of the tables before it, none of which changed, so those rows
are the same at ``v'``, and ``k`` is found from ``T``'s changes. A NULL join key
matches nothing, on both sides, as in SQL.

This module says which joins each step needs; running them is the consumer's.
"""

from __future__ import annotations

from collections.abc import Mapping

from lakeprop.consumers.join_view.query import Join, JoinQuery


def path_to(query: JoinQuery, alias: str) -> tuple[Join, ...]:
    """The joins that connect the source ``alias`` to the first table, in the
    query's order: the join that adds it and, transitively, those adding every
    table its equalities refer to. Empty for the first table itself."""
    by_alias = {j.source.alias: j for j in query.joins}
    if alias != query.first.alias and alias not in by_alias:
        raise KeyError(f"{alias} is not a table of the query")
    needed: set[str] = set()
    pending = [alias]
    while pending:
        current = pending.pop()
        join = by_alias.get(current)
        if join is None or current in needed:
            continue
        needed.add(current)
        pending += [earlier.alias for earlier, _ in join.on]
    return tuple(j for j in query.joins if j.source.alias in needed)


def discovery_joins(query: JoinQuery) -> dict[str, tuple[Join, ...]]:
    """For each source, the joins step 1 runs against its changes (see the module)."""
    return {source.alias: path_to(query, source.alias) for source in query.sources}


def one_row_per_first_key(query: JoinQuery, keys: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether the view holds at most one row per row of the first table: every join
    matches its table on the whole of that table's key (``keys``, by alias), so that
    each row it joins to meets at most one of its rows (a fact joined with its
    dimensions), as long as each pair of joined columns is of one type (a cast can
    make two keys equal; the consumer checks the types it reads). Then a row of the
    view is found by the first table's key alone, and the target's rows of a key are
    replaced without reading them first."""
    for join in query.joins:
        matched = {right.name.lower() for _, right in join.on}
        if not {c.lower() for c in keys[join.source.alias]} <= matched:
            return False
    return True
