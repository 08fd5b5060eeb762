"""The join view's SQL, run on sqlglot's executor (a SQL engine in Python), gives
what the Python model gives: the affected keys of random changes, and the view's rows for them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlglot.executor import env, execute

from devkit.join_model import Row, affected_keys, evaluate
from lakeprop.consumers.join_view import sql
from lakeprop.consumers.join_view.options import JoinViewOptions, parse_options

OPTIONS = [
    parse_options(
        {
            "query": "SELECT o.id, c.name AS name, p.title FROM s.o o LEFT JOIN s.c c "
            "ON o.cid = c.cid JOIN s.p p ON p.pid = o.pid WHERE o.id > 0",
            "keys": {"o": ["id"], "c": ["cid"], "p": ["pid"]},
        }
    ),
    parse_options(
        {
            "query": "SELECT a.id, b.v, c.w FROM s.a a LEFT JOIN s.b b ON a.x = b.x "
            "LEFT JOIN s.c c ON c.y = b.y AND c.z = a.z",
            "keys": {"a": ["id"], "b": ["bid"], "c": ["cid"]},
        }
    ),
]
COLUMNS = [
    {"o": ["id", "cid", "pid"], "c": ["cid", "name"], "p": ["pid", "title"]},
    {"a": ["id", "x", "z"], "b": ["bid", "x", "y", "v"], "c": ["cid", "y", "z", "w"]},
]


# Spark's null-safe equality (``<=>``), which sqlglot's executor lacks: Python's
# ``==`` on None is just that
env.ENV.setdefault("NULLSAFEEQ", lambda a, b: a == b)


def _rows(rng: random.Random, alias: str, columns: list[str], key: str) -> list[Row]:
    return [
        {c: k if c == key else rng.choice([None, 0, 1, 2]) for c in columns}
        for k in rng.sample(range(8), rng.randint(0, 6))
    ]


def _run(text: str, tables: dict[str, list[Row]], case: int) -> list[tuple[Any, ...]]:
    schema = {
        name: {c: "INT" for c in (["id"] if name == "keys" else COLUMNS[case][name[2:]])}
        for name in tables
    }
    return sorted(execute(text, schema, "spark", tables).rows, key=repr)


@pytest.mark.parametrize("case", [0, 1], ids=["star", "two-parent"])
def test_the_sql_gives_what_the_model_gives(case: int) -> None:
    options: JoinViewOptions = OPTIONS[case]
    query = options.query
    first = query.first.alias
    for seed in range(25):
        rng = random.Random(seed)
        cols = COLUMNS[case]
        tables = {a: _rows(rng, a, c, options.keys[a][0]) for a, c in cols.items()}
        images = {
            a: _rows(rng, a, c, options.keys[a][0]) for a, c in cols.items() if rng.random() < 0.6
        }
        if not images:
            continue
        views = {a: f"t_{a}" for a in tables}
        named = {f"t_{a}": rows for a, rows in tables.items()}
        named |= {f"d_{a}": rows for a, rows in images.items()}
        # sqlglot's executor mishandles a UNION of these; each part is run alone
        parts = sql.affected_parts(options, views, {a: f"d_{a}" for a in images})
        found = sorted({row for part in parts for row in _run(part, named, case)}, key=repr)
        assert sql.affected(options, views, {a: f"d_{a}" for a in images}) == " UNION ".join(parts)
        assert set(found) == affected_keys(query, tables, images, options.keys[first])

        keys = [{"id": k} for (k,) in found]
        rows = _run(sql.recompute(options, views, "keys"), {**named, "keys": keys}, case)
        expected = sorted(
            (
                tuple(_output(o.name, combo, query) for o in query.outputs)
                + tuple(
                    None if combo[alias] is None else combo[alias][column]  # type: ignore[index]
                    for alias, column, _ in options.identity
                )
                for combo in evaluate(query, tables)
                if (combo[first] or {})["id"] in {k["id"] for k in keys}
                and (case != 0 or (combo[first] or {})["id"] > 0)
            ),
            key=repr,
        )
        assert rows == expected, seed


def _output(name: str, combo: dict[str, Row | None], query: Any) -> Any:
    """The test queries' outputs are plain columns."""
    (column,) = next(o for o in query.outputs if o.name == name).reads
    row = combo[column.alias]
    return None if row is None else row[column.name]
