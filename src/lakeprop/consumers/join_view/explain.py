"""What ``lakeprop explain`` says of a join view: its sources and the versions each
is joined at, the target's keys, the technique, and how each source's layout
serves the iteration's lookups. Pure: the caller reads the versions and layouts.

Both steps of an iteration (:mod:`.plan`) look tables up by the columns they are
joined on: a joined table's changes find the first table's rows through the
joins, and the affected keys' rows are recomputed through them. A table
partitioned or clustered on one of its join columns lets Delta skip the files
that cannot match; any other is scanned whole by each iteration that reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lakeprop.consumers.join_view.options import JoinViewOptions
from lakeprop.consumers.join_view.plan import one_row_per_first_key


@dataclass(frozen=True)
class Layout:
    """How a table's files are laid out: its partition and clustering columns."""

    partitioned: tuple[str, ...] = ()
    clustered: tuple[str, ...] = ()


def lookup_columns(view: JoinViewOptions, alias: str) -> tuple[str, ...]:
    """The columns of the source ``alias`` the joins equate with another table's, in
    the query's order."""
    seen: dict[str, str] = {}
    for join in view.query.joins:
        for left, right in join.on:
            for column in (left, right):
                if column.alias == alias:
                    seen.setdefault(column.name.lower(), column.name)
    return tuple(seen.values())


def layout_note(columns: tuple[str, ...], layout: Layout | None) -> str:
    """How ``layout`` serves lookups by ``columns``."""
    if layout is None:
        return "layout unknown (the table could not be read)"
    wanted = {c.lower() for c in columns}
    for kind, laid in (("clustered", layout.clustered), ("partitioned", layout.partitioned)):
        served = [c for c in laid if c.lower() in wanted]
        if served:
            return f"{kind} on {', '.join(served)}: lookups by it skip the files that cannot match"
    return (
        f"warning: neither clustered nor partitioned on {', '.join(columns)}; each iteration "
        f"that reads it scans it whole (ALTER TABLE ... CLUSTER BY ({', '.join(columns)}))"
    )


def explain(
    view: JoinViewOptions,
    versions: Mapping[str, str],
    layouts: Mapping[str, Layout | None],
) -> list[str]:
    """The lines of the explanation; ``versions`` and ``layouts`` by source alias."""
    query = view.query
    lines = ["sources:"]
    for n, source in enumerate(query.sources):
        role = "first table (the job's source)" if n == 0 else "joined"
        if n:
            join = query.joins[n - 1]
            on = " AND ".join(f"{left.sql()} = {right.sql()}" for left, right in join.on)
            role = f"{join.kind.upper()} JOIN ON {on}"
        lines.append(
            f"  {source.alias} = {source.name}: {role}, at {versions.get(source.alias, '?')}"
        )
    lines.append("target keys (the view's identity):")
    for alias, column, name in view.identity:
        lines.append(f"  {name} = {alias}.{column}")
    merged = (
        f"MERGEd on {query.first.alias}'s key alone (every join meets its table's whole "
        "key: one row per first-table row, where each pair of joined columns is of one "
        "type; else on the identity)"
        if one_row_per_first_key(query, view.keys)
        else "MERGEd on the identity"
    )
    lines.append(
        "technique: incremental from every table's change feed: the first table's keys "
        "that the changes touch are found through the joins and recomputed, every table "
        f"pinned at its version, and {merged}"
    )
    lines.append("layout:")
    for source in query.sources:
        columns = lookup_columns(view, source.alias)
        lines.append(
            f"  {source.name} (looked up by {', '.join(columns)}): "
            + layout_note(columns, layouts.get(source.alias))
        )
    return lines
