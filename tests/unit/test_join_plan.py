"""A join view's iteration recomputes the first table's affected keys alone: the
rows of every other key are the same before and after any change of any source."""

from __future__ import annotations

import random
from typing import Any

import pytest

from devkit.join_model import Row, affected_keys, evaluate
from lakeprop.consumers.join_view.plan import discovery_joins, one_row_per_first_key, path_to
from lakeprop.consumers.join_view.query import parse_join_query

STAR = parse_join_query(
    "SELECT o.id, c.name, p.title FROM s.o o LEFT JOIN s.c c ON o.cid = c.cid "
    "JOIN s.p p ON p.pid = o.pid"
)
CHAIN = parse_join_query(
    "SELECT a.id, b.v, c.w FROM s.a a JOIN s.b b ON a.x = b.x LEFT JOIN s.c c ON c.y = b.y"
)
BOTH = parse_join_query(
    "SELECT a.id FROM s.a a LEFT JOIN s.b b ON a.x = b.x LEFT JOIN s.c c ON c.y = b.y AND c.z = a.z"
)


def test_each_source_is_reached_through_the_joins_that_connect_it() -> None:
    assert [j.source.alias for j in path_to(STAR, "p")] == ["p"]
    assert [j.source.alias for j in path_to(STAR, "c")] == ["c"]
    assert [j.source.alias for j in path_to(CHAIN, "c")] == ["b", "c"]
    assert [j.source.alias for j in path_to(BOTH, "c")] == ["b", "c"]
    assert discovery_joins(CHAIN)["a"] == ()
    with pytest.raises(KeyError):
        path_to(CHAIN, "z")


COLUMNS = {
    STAR: {"o": ["id", "cid", "pid"], "c": ["cid", "name"], "p": ["pid", "title"]},
    CHAIN: {"a": ["id", "x"], "b": ["bid", "x", "y", "v"], "c": ["cid", "y", "w"]},
    BOTH: {"a": ["id", "x", "z"], "b": ["bid", "x", "y"], "c": ["cid", "y", "z"]},
}
KEYS = {"o": "id", "a": "id", "c": "cid", "p": "pid", "b": "bid"}


def _table(rng: random.Random, columns: list[str], key: str) -> dict[Any, Row]:
    rows: dict[Any, Row] = {}
    for k in rng.sample(range(8), rng.randint(0, 6)):
        rows[k] = {c: k if c == key else rng.choice([None, 0, 1, 2]) for c in columns}
    return rows


def _change(
    rng: random.Random, rows: dict[Any, Row], columns: list[str], key: str
) -> tuple[dict[Any, Row], list[Row]]:
    """Some inserts, updates (a join key among them, or the key itself) and deletes;
    the new rows and the pre- and post-images."""
    new, images = dict(rows), []
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(8)
        old = new.pop(k, None)
        if old is not None:
            images.append(old)
        if rng.random() < 0.7:
            moved = rng.randrange(8) if rng.random() < 0.2 else k
            if moved in new:
                images.append(new[moved])
            row = {c: moved if c == key else rng.choice([None, 0, 1, 2]) for c in columns}
            new[moved] = row
            images.append(row)
    return new, images


def _by_key(query: Any, combos: list[dict[str, Row | None]]) -> dict[Any, list[Any]]:
    grouped: dict[Any, list[Any]] = {}
    for combo in combos:
        first = combo[query.first.alias]
        assert first is not None
        frozen = tuple(
            (a, None if r is None else tuple(sorted(r.items()))) for a, r in sorted(combo.items())
        )
        grouped.setdefault(first["id"], []).append(frozen)
    return {k: sorted(v, key=repr) for k, v in grouped.items()}


@pytest.mark.parametrize("query", [STAR, CHAIN, BOTH], ids=["star", "chain", "both"])
def test_only_the_affected_keys_rows_change(query: Any) -> None:
    for seed in range(300):
        _only_the_affected_keys_rows_change(query, random.Random(seed))


def _only_the_affected_keys_rows_change(query: Any, rng: random.Random) -> None:
    columns = COLUMNS[query]
    old = {a: _table(rng, cols, KEYS[a]) for a, cols in columns.items()}
    new, images = {}, {}
    for alias, cols in columns.items():
        if rng.random() < 0.6:
            new[alias], images[alias] = _change(rng, old[alias], cols, KEYS[alias])
        else:
            new[alias] = old[alias]
    before = _by_key(query, evaluate(query, {a: list(t.values()) for a, t in old.items()}))
    now = {a: list(t.values()) for a, t in new.items()}
    after = _by_key(query, evaluate(query, now))
    affected = {k for (k,) in affected_keys(query, now, images, ["id"])}
    for key in set(before) | set(after):
        if key not in affected:
            assert before.get(key) == after.get(key), (key, affected, images)


def test_the_affected_keys_are_exactly_those_a_change_reaches() -> None:
    """A change of the chain's last table reaches the first table's rows through the
    middle one, and no other: a key joined to another middle row is not affected."""
    new = {
        "a": [{"id": 1, "x": 1}, {"id": 2, "x": 2}, {"id": 3, "x": None}],
        "b": [{"bid": 1, "x": 1, "y": 5, "v": 0}, {"bid": 2, "x": 2, "y": 6, "v": 0}],
        "c": [{"cid": 7, "y": 5, "w": 0}],
    }
    changed_c = {"c": [{"cid": 7, "y": 5, "w": 0}, {"cid": 7, "y": 4, "w": 1}]}
    assert affected_keys(CHAIN, new, changed_c, ["id"]) == {(1,)}
    changed_b = {"b": [{"bid": 2, "x": 2, "y": 6, "v": 0}, {"bid": 2, "x": None, "y": 6, "v": 0}]}
    assert affected_keys(CHAIN, new, changed_b, ["id"]) == {(2,)}
    changed_a = {"a": [{"id": 3, "x": None}]}
    assert affected_keys(CHAIN, new, changed_a, ["id"]) == {(3,)}


DIMENSIONS = parse_join_query(
    "SELECT o.id, c.name, r.label FROM s.o o LEFT JOIN s.c c ON o.cid = c.cid "
    "JOIN s.r r ON r.rid = c.rid AND r.kind = c.kind"
)


def test_a_view_whose_every_join_meets_its_tables_key_has_one_row_per_first_key() -> None:
    keys = {"o": ("id",), "c": ("cid",), "p": ("pid",), "r": ("rid", "KIND")}
    assert one_row_per_first_key(STAR, keys)
    assert one_row_per_first_key(DIMENSIONS, keys)
    assert not one_row_per_first_key(DIMENSIONS, {**keys, "r": ("rid", "kind", "at")})
    assert not one_row_per_first_key(STAR, {**keys, "c": ("cid", "region")})
    assert not one_row_per_first_key(CHAIN, {"a": ("id",), "b": ("bid",), "c": ("cid",)})
    # and the model agrees: with unique keys, each first row makes at most one row
    rng = random.Random(7)
    for _ in range(200):
        tables = {a: list(_table(rng, cols, KEYS[a]).values()) for a, cols in COLUMNS[STAR].items()}
        rows = _by_key(STAR, evaluate(STAR, tables))
        assert all(len(combos) == 1 for combos in rows.values()), rows
