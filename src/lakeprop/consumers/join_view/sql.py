"""The Spark SQL of a join view's iteration (see :mod:`.plan`), built from its options.

Every source is read from a view the consumer names (the source at its pinned
version, or a source's pre- and post-images), in the database ``schema`` when one
is given (Spark's ``global_temp``: a view there is seen from every session); every
identifier is one the options validated, and quoted with
:func:`~lakeprop.identifiers.quote` (which validates it again), view names too.
The SQL is plain enough for any engine with inner and left joins: the tests run
it on sqlglot's executor against the Python model, and the consumer runs it on
Spark.
"""

from __future__ import annotations

from collections.abc import Mapping

from lakeprop.consumers.join_view.options import JoinViewOptions
from lakeprop.consumers.join_view.plan import path_to
from lakeprop.consumers.join_view.query import Join
from lakeprop.identifiers import quote


def _on(join: Join) -> str:
    return " AND ".join(f"{left.sql()} = {right.sql()}" for left, right in join.on)


def _relation(view: str, schema: str | None) -> str:
    return quote(view) if schema is None else f"{quote(schema)}.{quote(view)}"


def _join(join: Join, view: str, kind: str, schema: str | None = None) -> str:
    relation = _relation(view, schema)
    return f" {kind} JOIN {relation} AS {quote(join.source.alias)} ON {_on(join)}"


def affected(
    options: JoinViewOptions,
    views: Mapping[str, str],
    changes: Mapping[str, str],
    schema: str | None = None,
) -> str:
    """The first table's distinct keys whose rows the changes can touch (step 1), each once:
    ``changes`` maps each changed source's alias to a view of its pre- and
    post-images, ``views`` every source's alias to its view at the new versions."""
    return " UNION ".join(affected_parts(options, views, changes, schema))


def affected_parts(
    options: JoinViewOptions,
    views: Mapping[str, str],
    changes: Mapping[str, str],
    schema: str | None = None,
) -> list[str]:
    """The SELECTs of :func:`affected`, one per changed source."""
    query = options.query
    first = query.first.alias
    selected = ", ".join(f"{quote(first)}.{quote(c)} AS {quote(c)}" for c in options.keys[first])
    parts = []
    for alias, images in changes.items():
        if alias == first:
            parts.append(
                f"SELECT DISTINCT {selected} FROM {_relation(images, schema)} AS {quote(first)}"
            )
            continue
        joins = "".join(
            _join(j, images if j.source.alias == alias else views[j.source.alias], "INNER", schema)
            for j in path_to(query, alias)
        )
        source = _relation(views[first], schema)
        parts.append(f"SELECT DISTINCT {selected} FROM {source} AS {quote(first)}{joins}")
    if not parts:
        raise ValueError("no source changed")
    return parts


def recompute(
    options: JoinViewOptions,
    views: Mapping[str, str],
    keys: str | None,
    schema: str | None = None,
) -> str:
    """The view's rows (its outputs, then its identity columns) for the first
    table's keys in the view ``keys`` (every key with ``None``; a NULL key is
    matched too, as the MERGE on the identity matches it), each source read from
    ``views`` by alias."""
    query = options.query
    first = query.first.alias
    source = _relation(views[first], schema)
    if keys is not None:
        key = options.keys[first]
        reads = {c.lower(): c for c in (*query.reads(first), *key)}
        read = ", ".join(f"__f.{quote(c)}" for c in reads.values())
        wanted = ", ".join(quote(c) for c in key)
        on = " AND ".join(f"__f.{quote(c)} <=> __k.{quote(c)}" for c in key)
        source = (
            f"(SELECT {read} FROM {source} AS __f JOIN "
            f"(SELECT DISTINCT {wanted} FROM {_relation(keys, schema)}) AS __k ON {on})"
        )
    columns = [f"{o.sql} AS {quote(o.name)}" for o in query.outputs]
    columns += [
        f"{quote(alias)}.{quote(column)} AS {quote(name)}"
        for alias, column, name in options.identity
    ]
    joins = "".join(
        _join(j, views[j.source.alias], "LEFT" if j.kind == "left" else "INNER", schema)
        for j in query.joins
    )
    where = f" WHERE {query.where}" if query.where else ""
    return f"SELECT {', '.join(columns)} FROM {source} AS {quote(first)}{joins}{where}"
