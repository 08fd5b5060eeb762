"""``join_view`` options: the query and each source's primary key, validated without Spark.

The view's identity is its sources' keys: each row holds one row of the first
table and at most one of each joined table, so the first table's key and every
joined table's key (NULL where a LEFT join padded) identify it. The target keeps
them in columns of its own (:func:`identity_column`), so that a MERGE finds a
row's old version and the target's change feed has proper pre- and post-images
for jobs downstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakeprop.consumers.join_view.query import RESERVED_PREFIX, JoinQuery, parse_join_query
from lakeprop.consumers.options import (
    TARGET_OPTIONS,
    identifier_list,
    reject_unknown_options,
    target_options,
)
from lakeprop.errors import InvalidConsumerOptionsError

NAME = "join_view"
ALLOWED = {"query", "keys", *TARGET_OPTIONS}


def identity_column(alias: str, column: str) -> str:
    """The target column that keeps the source ``alias``'s key column ``column``."""
    return f"{RESERVED_PREFIX}{alias}__{column}"


@dataclass(frozen=True)
class JoinViewOptions:
    """The options of one ``join_view`` job, normalised."""

    query: JoinQuery
    keys: Mapping[str, tuple[str, ...]]
    """Each source's primary key, by its alias in the query."""
    target: Mapping[str, Any]

    @property
    def identity(self) -> tuple[tuple[str, str, str], ...]:
        """(alias, key column, target column) of every identity column, the first
        table's first."""
        return tuple(
            (source.alias, column, identity_column(source.alias, column))
            for source in self.query.sources
            for column in self.keys[source.alias]
        )

    @property
    def other_sources(self) -> tuple[tuple[str, str], ...]:
        """(database, table) of every source but the first (the one the job is on)."""
        return tuple((s.database, s.table) for s in self.query.sources[1:])


def parse_options(options: Mapping[str, Any]) -> JoinViewOptions:
    """Raise InvalidConsumerOptionsError naming what is wrong with ``options``."""
    reject_unknown_options(NAME, options, ALLOWED)
    if "query" not in options:
        raise InvalidConsumerOptionsError(f"{NAME} option query is required")
    query = parse_join_query(options["query"], f"{NAME} option query")
    given = options.get("keys")
    if not isinstance(given, Mapping) or not given:
        raise InvalidConsumerOptionsError(
            f"{NAME} option keys is required: each table's primary key by its alias "
            f"in the query, e.g. {{{', '.join(repr(s.alias) + ': [...]' for s in query.sources)}}}"
        )
    aliases = {s.alias.lower(): s.alias for s in query.sources}
    unknown = sorted(str(a) for a in given if str(a).lower() not in aliases)
    if unknown:
        raise InvalidConsumerOptionsError(
            f"{NAME} option keys names {unknown}, which the query does not: its tables "
            f"are {sorted(aliases.values())}"
        )
    keys: dict[str, tuple[str, ...]] = {}
    for alias, columns in given.items():
        name = aliases[str(alias).lower()]
        if name in keys:
            raise InvalidConsumerOptionsError(f"{NAME} option keys names {name} twice")
        keys[name] = tuple(identifier_list(columns, NAME, f"keys.{alias}"))
    missing = [s.alias for s in query.sources if s.alias not in keys]
    if missing:
        raise InvalidConsumerOptionsError(
            f"{NAME} option keys lacks the primary key of {missing}: the view's rows are "
            "identified by every table's key"
        )
    parsed = JoinViewOptions(query, keys, target_options(options))
    names = [name.lower() for _, _, name in parsed.identity]
    names += [o.name.lower() for o in query.outputs]
    if len(set(names)) != len(names):
        raise InvalidConsumerOptionsError(
            f"{NAME}: the identity columns {[n for _, _, n in parsed.identity]} collide "
            "(an alias or key name holding '__'); rename the alias"
        )
    return parsed
