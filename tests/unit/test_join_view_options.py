"""The join view's options: its query, and every table's primary key by its alias."""

from __future__ import annotations

from typing import Any

import pytest

from lakeprop.consumers.join_view.options import parse_options
from lakeprop.errors import InvalidConsumerOptionsError

QUERY = "SELECT o.id, c.name FROM sales.orders o LEFT JOIN sales.customers c ON o.cid = c.id"


def test_the_identity_is_every_tables_key_the_first_tables_first() -> None:
    options = parse_options({"query": QUERY, "keys": {"c": ["id"], "O": ["id", "line"]}})
    assert options.keys == {"o": ("id", "line"), "c": ("id",)}
    assert options.identity == (
        ("o", "id", "__o__id"),
        ("o", "line", "__o__line"),
        ("c", "id", "__c__id"),
    )
    assert options.other_sources == (("sales", "customers"),)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"keys": {"o": ["id"]}}, "option query is required"),
        ({"query": QUERY}, "option keys is required"),
        ({"query": QUERY, "keys": {"o": ["id"]}}, "lacks the primary key of ['c']"),
        ({"query": QUERY, "keys": {"o": ["id"], "c": ["id"], "x": ["id"]}}, "names ['x']"),
        ({"query": QUERY, "keys": {"o": [], "c": ["id"]}}, "non-empty list"),
        ({"query": QUERY, "keys": {"o": ["id"], "c": ["id"]}, "mode": 1}, "unknown option"),
        ({"query": "SELECT o.id FROM sales.orders o", "keys": {"o": ["id"]}}, "one table"),
        ({"query": QUERY, "keys": {"o": ["id"], "O": ["k"], "c": ["id"]}}, "names o twice"),
        (
            {
                "query": "SELECT a.x FROM d.t a JOIN d.u a__b ON a.k = a__b.k",
                "keys": {"a": ["b__c"], "a__b": ["c"]},
            },
            "collide",
        ),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConsumerOptionsError) as refused:
        parse_options(options)
    assert message in str(refused.value), str(refused.value)
