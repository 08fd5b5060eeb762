"""The join view's query: the shape it keeps is parsed into sources, joins and
outputs, and every construct outside it is refused by name."""

from __future__ import annotations

import pytest

from lakeprop.consumers.join_view.query import Column, Join, Source, parse_join_query
from lakeprop.errors import InvalidConsumerOptionsError

ORDERS = """
    SELECT o.id, o.amount * 2 AS twice, c.name AS customer, p.title
    FROM sales.orders AS o
    LEFT JOIN sales.customers c ON o.customer_id = c.id AND c.region = o.region
    JOIN shop.products AS p ON (p.sku = o.sku)
    WHERE o.amount > 0 AND c.name IS NOT NULL
"""


def test_a_three_table_query_names_its_sources_joins_outputs_and_filter() -> None:
    q = parse_join_query(ORDERS)
    assert q.sources == (
        Source("o", "sales", "orders"),
        Source("c", "sales", "customers"),
        Source("p", "shop", "products"),
    )
    assert q.joins == (
        Join(
            "left",
            Source("c", "sales", "customers"),
            (
                (Column("o", "customer_id"), Column("c", "id")),
                (Column("o", "region"), Column("c", "region")),
            ),
        ),
        Join("inner", Source("p", "shop", "products"), ((Column("o", "sku"), Column("p", "sku")),)),
    )
    assert [(o.name, o.sql) for o in q.outputs] == [
        ("id", "`o`.`id`"),
        ("twice", "`o`.`amount` * 2"),
        ("customer", "`c`.`name`"),
        ("title", "`p`.`title`"),
    ]
    assert q.where == "`o`.`amount` > 0 AND NOT `c`.`name` IS NULL"
    assert q.reads("o") == ("id", "amount", "customer_id", "region", "sku")
    assert q.reads("c") == ("name", "id", "region")
    assert q.reads("p") == ("title", "sku")


def test_a_table_without_an_alias_is_named_by_its_table_and_inner_is_the_default() -> None:
    q = parse_join_query(
        "SELECT orders.id, customers.name FROM s.orders INNER JOIN s.customers "
        "ON customers.id = orders.cid"
    )
    assert [s.alias for s in q.sources] == ["orders", "customers"]
    assert q.joins[0].kind == "inner"
    assert q.joins[0].on == ((Column("orders", "cid"), Column("customers", "id")),)
    assert q.where is None


def test_left_outer_is_a_left_join() -> None:
    q = parse_join_query("SELECT a.x FROM d.a a LEFT OUTER JOIN d.b b ON a.k = b.k")
    assert q.joins[0].kind == "left"


REFUSED = {
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k < b.k": "a.k < b.k",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k OR a.j = b.j": "OR",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = 1": "a.k = 1",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = a.j": "a column of b",
    "SELECT a.x FROM d.a a JOIN d.b b USING (k)": "USING",
    "SELECT a.x FROM d.a a NATURAL JOIN d.b b": "NATURAL",
    "SELECT a.x FROM d.a a CROSS JOIN d.b b": "CROSS",
    "SELECT a.x FROM d.a a JOIN d.b b": "without ON",
    "SELECT a.x FROM d.a a LEFT SEMI JOIN d.b b ON a.k = b.k": "SEMI",
    "SELECT a.x FROM d.a a RIGHT JOIN d.b b ON a.k = b.k": "LEFT JOIN with the tables swapped",
    "SELECT a.x FROM d.a a FULL OUTER JOIN d.b b ON a.k = b.k": "FULL OUTER JOIN",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k WHERE a.x IN (SELECT 1)": "subquery",
    "SELECT a.x FROM (SELECT 1 AS x) a JOIN d.b b ON a.x = b.k": "subquery",
    "SELECT sum(a.x) AS s FROM d.a a JOIN d.b b ON a.k = b.k": "aggregate_view",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k GROUP BY a.x": "GROUP BY",
    "SELECT row_number() OVER (ORDER BY a.x) AS n FROM d.a a JOIN d.b b ON a.k = b.k": "window",
    "SELECT DISTINCT a.x FROM d.a a JOIN d.b b ON a.k = b.k": "DISTINCT",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k ORDER BY a.x": "ORDER BY",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k LIMIT 3": "LIMIT",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k UNION SELECT a.x FROM d.a a": "set operation",
    "WITH q AS (SELECT 1) SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k": "WITH",
    "SELECT rand() AS r FROM d.a a JOIN d.b b ON a.k = b.k": "rand()",
    "SELECT current_timestamp() AS t FROM d.a a JOIN d.b b ON a.k = b.k": "current_timestamp()",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k WHERE uuid() > ''": "uuid()",
    "SELECT * FROM d.a a JOIN d.b b ON a.k = b.k": "*",
    "SELECT a.* FROM d.a a JOIN d.b b ON a.k = b.k": "*",
    "SELECT x FROM d.a a JOIN d.b b ON a.k = b.k": "qualify the column x",
    "SELECT z.x FROM d.a a JOIN d.b b ON a.k = b.k": "names no table",
    "SELECT a.x + 1 FROM d.a a JOIN d.b b ON a.k = b.k": "with AS",
    "SELECT a.x, b.x FROM d.a a JOIN d.b b ON a.k = b.k": "twice",
    "SELECT a.x AS __key FROM d.a a JOIN d.b b ON a.k = b.k": "consumer's own",
    "SELECT a.x FROM a JOIN d.b b ON a.k = b.k": "without its database",
    "SELECT a.x FROM d.a a JOIN d.a b ON a.k = b.k": "itself",
    "SELECT a.x FROM d.a a JOIN d.b a ON a.k = a.k": "alias a for two tables",
    "SELECT a.x FROM d.a a": "reads one table",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k JOIN d.c c ON c.k = a.k "
    "JOIN d.e e ON e.k = a.k": "4 tables",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k; SELECT 1": "one SELECT statement",
    "INSERT INTO d.t SELECT 1": "SELECT",
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = b.k WHERE": "not valid SQL",
    "SELECT a.x FROM `d-x`.a a JOIN d.b b ON a.k = b.k": "not a valid identifier",
    "": "non-empty",
    "SELECT explode(a.arr) AS e FROM d.a a JOIN d.b b ON a.k = b.k": "generator",
    "SELECT json_tuple(a.j, 'x') AS e FROM d.a a JOIN d.b b ON a.k = b.k": "generator",
    "SELECT a.x FROM d.a VERSION AS OF 3 a JOIN d.b b ON a.k = b.k": "version",
    "SELECT a.x FROM d.a TABLESAMPLE (10 PERCENT) a JOIN d.b b ON a.k = b.k": "sample",
    "SELECT a.x FROM d.a AS a(y, x) JOIN d.b b ON a.k = b.k": "renaming the columns",
    "SELECT a.x FROM d.a a OUTER JOIN d.b b ON a.k = b.k": "OUTER JOIN without LEFT",
    "SELECT a.x FROM d.a a, d.b b": "CROSS",
    "SELECT uniform(0, 10) AS u FROM d.a a JOIN d.b b ON a.k = b.k": "uniform()",
    "SELECT reflect('java.util.UUID', 'randomUUID') AS u FROM d.a a JOIN d.b b ON a.k = b.k": (
        "reflect()"
    ),
    "SELECT a.x FROM d.a a JOIN d.b b ON a.k = c.k JOIN d.c c ON c.k = a.k": "names no table",
}


@pytest.mark.parametrize("query", list(REFUSED))
def test_a_construct_outside_the_shape_is_refused_by_name(query: str) -> None:
    with pytest.raises(InvalidConsumerOptionsError) as refused:
        parse_join_query(query)
    assert REFUSED[query] in str(refused.value), str(refused.value)
