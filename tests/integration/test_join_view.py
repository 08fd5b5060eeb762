"""``join_view``: a SQL join of two tables, kept from both change feeds by the service.

Orders LEFT JOIN customers, registered on the orders. Every step changes one side
or the other (a side-only change makes the job due too), and after each the
target is compared whole with the same SQL run by Spark over both tables at the
versions the job's status records (time travel): inserts, a NULL join key, a
dimension update, a join-key change, a customer whose orders become null-padded
and one who gets their first, a dimension's key that moves, and several orders
per customer. Registering on the wrong table or with a joined table whose change
feed is off is refused, naming what to do. The three-table test below goes
through more kinds of change hand-driven (a key-changing update, an overwrite, a
re-created table), and the fuzzer through every kind on every table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from devkit.harness import (
    cdf_source,
    cdf_table,
    cli_settings,
    client_row,
    history,
    latest_version,
    running,
)
from devkit.iterations import HandDriven, IterationFailed
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.engine.fanout import session_confs
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

ORDERS = "id INT, customer_id INT, amount DOUBLE"
CUSTOMERS = "id INT, name STRING"
QUERY = (
    "SELECT o.id, o.amount, upper(c.name) AS customer "
    "FROM j.orders AS o LEFT JOIN j.customers AS c ON o.customer_id = c.id "
    "WHERE o.amount > 0"
)
KEY = JobKey(1, "j", "orders", "enriched")  # -> j.orders_enriched
COPY = JobKey(1, "j", "orders", "copy")


def spec(query: str = QUERY) -> dict[str, Any]:
    return {
        "trigger": {"kind": "default"},
        "iteration": {
            "consumer": {
                "type": "join_view",
                "options": {"query": query, "keys": {"o": ["id"], "c": ["id"]}},
            }
        },
    }


def at(spark: SparkSession, path: str, version: int, name: str) -> None:
    spark.read.format("delta").option("versionAsOf", version).load(path).createOrReplaceTempView(
        name
    )


def expected(
    spark: SparkSession, orders: str, customers: str, versions: tuple[int, int]
) -> DataFrame:
    at(spark, orders, versions[0], "jv_orders")
    at(spark, customers, versions[1], "jv_customers")
    return spark.sql(
        "SELECT o.id, o.amount, upper(c.name) AS customer "
        "FROM jv_orders AS o LEFT JOIN jv_customers AS c ON o.customer_id = c.id "
        "WHERE o.amount > 0"
    )


def reached(spark: SparkSession, config: AppConfig, orders: str, customers: str) -> tuple[int, int]:
    """The (orders, customers) versions the job records once it reflects both tables'
    latest versions."""
    wanted = (latest_version(spark, orders), latest_version(spark, customers))

    def check() -> tuple[int, int]:
        row = client_row(config, spark, KEY)
        status = json.loads(row["job_status"])
        joined = status.get("joined", {}).get("j.customers", {}).get("version")
        assert (row["watermark"], joined, row["job_state"]) == (*wanted, "completed"), status
        return wanted

    return assert_eventually(check, timeout=90, interval=0.25)


def test_a_join_view_follows_both_tables(
    spark: SparkSession, app_config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    config = app_config
    orders = cdf_source(spark, config, "j", "orders", ORDERS)
    customers = f"{config.tables.warehouse}/j/customers"  # clustered on its join key
    (
        DeltaTable.create(spark)
        .location(customers)
        .addColumns(spark.createDataFrame([], CUSTOMERS).schema)
        .clusterBy("id")
        .property("delta.enableChangeDataFeed", "true")
        .execute()
    )
    spark.sql(
        f"INSERT INTO delta.`{orders}` VALUES (1, 10, 5.0), (2, 10, 7.0), (3, 20, 1.0), "
        "(4, NULL, 2.0), (5, 30, 3.0)"
    )
    spark.sql(f"INSERT INTO delta.`{customers}` VALUES (10, 'ann'), (20, 'bob')")
    target = f"{config.tables.warehouse}/j/orders_enriched"
    client = LakepropClient(config.kafka, config.state, spark, tables=config.tables)

    def check() -> None:
        versions = reached(spark, config, orders, customers)
        assert_df_equality(
            spark.read.format("delta").load(target).select("id", "amount", "customer"),
            expected(spark, orders, customers, versions),
            ignore_row_order=True,
            ignore_nullable=True,
        )

    steps = [
        (customers, "UPDATE {t} SET name = 'anne' WHERE id = 10"),  # two orders change
        (orders, "UPDATE {t} SET customer_id = 20 WHERE id = 1"),  # a join key moves
        (customers, "INSERT INTO {t} VALUES (30, 'cy')"),  # order 5 gets its first match
        (customers, "DELETE FROM {t} WHERE id = 20"),  # orders 1 and 3 are null-padded
        (customers, "UPDATE {t} SET id = 40 WHERE id = 30"),  # the dimension's key moves
    ]
    copy = {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    with running(spark, config):
        # a replica in the same default group: the two share each tail of the orders,
        # each consumer on a session of its own
        assert client.wait_for_outcome(client.register_job(COPY, copy))["outcome"] == "applied"
        assert client.wait_for_outcome(client.register_job(KEY, spec()))["outcome"] == "applied"
        check()
        for path, sql in steps:
            spark.sql(sql.format(t=f"delta.`{path}`"))
            check()
        wrong = client.wait_for_outcome(
            client.register_job(JobKey(1, "j", "customers", "x"), spec())
        )
        assert wrong["outcome"] == "rejected" and "register it on j.orders" in wrong["detail"]
        plain = cdf_source(spark, config, "j", "plain", CUSTOMERS)
        spark.sql(
            f"ALTER TABLE delta.`{plain}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)"
        )
        off = client.wait_for_outcome(
            client.register_job(
                JobKey(1, "j", "orders", "off"), spec(QUERY.replace("j.customers", "j.plain"))
            )
        )
        assert off["outcome"] == "rejected" and "change feed, which is off" in off["detail"]
    shared = history(spark, config).where("kind = 'tail' AND size(members) = 2").count()
    assert shared > 0  # the join and the replica read one change set
    versions = reached(spark, config, orders, customers)
    capsys.readouterr()
    where = ["--account", "1", "--database", "j", "--table", "orders", "--name", "enriched"]
    assert cli.main([*cli_settings(config), "explain", *where]) == 0
    told = capsys.readouterr().out.splitlines()
    assert f"  o = j.orders: first table (the job's source), at version {versions[0]}" in told
    joined = "  c = j.customers: LEFT JOIN ON `o`.`customer_id` = `c`.`id`, at version"
    assert f"{joined} {versions[1]}" in told
    assert "  j.customers (looked up by id): clustered on id: " in "\n".join(told)
    assert any(line.startswith("  j.orders (looked up by customer_id): warning") for line in told)
    client.close()


THREE = (
    "SELECT o.id, o.amount, c.name, r.label AS region "
    "FROM j.orders AS o JOIN j.customers AS c ON o.customer_id = c.id "
    "LEFT JOIN j.regions AS r ON c.region_id = r.id WHERE o.amount > 0"
)


def test_a_three_table_join_is_exact_through_every_kind_of_change_and_a_lost_status(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Hand-driven iterations of a three-table join: changes on each table alone and
    together, a whole-table overwrite of a joined table, a joined table re-created,
    and a crash after a write whose watermark and joined versions never reached the
    catalog (they are set back, and the next tail starts from them)."""
    warehouse = str(tmp_path / "warehouse")
    paths = {name: f"{warehouse}/j/{name}" for name in ("orders", "customers", "regions")}
    for name, schema in (
        ("orders", ORDERS),
        ("customers", "id INT, name STRING, region_id INT"),
        ("regions", "id INT, label STRING"),
    ):
        cdf_table(spark, paths[name], schema)
    run = lambda table, sql: spark.sql(sql.format(t=f"delta.`{paths[table]}`"))  # noqa: E731
    run("orders", "INSERT INTO {t} VALUES (1, 10, 5.0), (2, 10, 7.0), (3, 20, 1.0), (4, NULL, 2.0)")
    run("customers", "INSERT INTO {t} VALUES (10, 'ann', 1), (20, 'bob', 2), (30, 'cy', NULL)")
    run("regions", "INSERT INTO {t} VALUES (1, 'north'), (2, 'south')")
    options = {"query": THREE, "keys": {"o": ["id"], "c": ["id"], "r": ["id"]}}
    driver = HandDriven(
        spark, warehouse, JobKey(1, "j", "orders", "v"), {"type": "join_view", "options": options}
    )

    def check() -> None:
        at(spark, paths["orders"], driver.watermark or 0, "jv_o")
        at(spark, paths["customers"], driver.joined["j.customers"].version, "jv_c")
        at(spark, paths["regions"], driver.joined["j.regions"].version, "jv_r")
        assert_df_equality(
            driver.read().select("id", "amount", "name", "region"),
            spark.sql(
                "SELECT o.id, o.amount, c.name, r.label AS region FROM jv_o AS o "
                "JOIN jv_c AS c ON o.customer_id = c.id LEFT JOIN jv_r AS r ON c.region_id = r.id "
                "WHERE o.amount > 0"
            ),
            ignore_row_order=True,
            ignore_nullable=True,
        )

    def rebuilds() -> int:
        """Writes of the whole view to its target (a snapshot or a resync): the others
        are MERGEs of the keys a range touched."""
        target = DeltaTable.forPath(spark, driver.path())
        return target.history().where("operation = 'WRITE'").count()

    def tail() -> None:
        driver.tail(latest_version(spark, paths["orders"]))
        assert driver.joined["j.customers"].version == latest_version(spark, paths["customers"])
        assert driver.joined["j.regions"].version == latest_version(spark, paths["regions"])
        check()

    driver.snapshot(latest_version(spark, paths["orders"]))
    check()
    run("regions", "UPDATE {t} SET label = 'north-east' WHERE id = 1")  # two steps away
    tail()
    run("customers", "UPDATE {t} SET region_id = 2 WHERE id = 10")  # a key of the path moves
    run("customers", "INSERT INTO {t} VALUES (40, 'di', 2)")
    run("orders", "INSERT INTO {t} VALUES (5, 40, 9.0), (6, 30, 1.5), (7, NULL, 1.0)")
    tail()  # all three moved
    before = (driver.watermark, dict(driver.joined))
    run("orders", "UPDATE {t} SET customer_id = 20 WHERE id = 1")
    run("regions", "DELETE FROM {t} WHERE id = 2")  # customers 10, 20, 40 lose their region
    tail()
    driver.watermark, driver.joined = before  # the write stood; the catalog lost its record
    run("customers", "DELETE FROM {t} WHERE id = 20")  # orders 1 and 3 leave the inner join
    run("orders", "UPDATE {t} SET id = 11 WHERE id = 2")  # a key-changing update
    tail()
    run("orders", "UPDATE {t} SET amount = -1.0 WHERE id = 6")  # filtered out
    tail()
    run("regions", "INSERT OVERWRITE {t} VALUES (1, 'n'), (2, 's'), (3, 'w')")
    tail()
    assert rebuilds() == 1  # the snapshot's: every tail so far was incremental
    shutil.rmtree(paths["regions"])  # re-created under the job: its versions start over
    cdf_table(spark, paths["regions"], "id INT, label STRING")
    run("regions", "INSERT INTO {t} VALUES (2, 'again')")
    tail()
    assert rebuilds() == 2  # a re-created joined table: the view recomputed whole
    the_job_fails_saying_what_to_do(spark, driver, run, paths)


def the_job_fails_saying_what_to_do(
    spark: SparkSession, driver: HandDriven, run: Any, paths: dict[str, str]
) -> None:
    """A key named in the options that is not unique (where it meets only a new row of
    the view, and where it meets one the target holds), then a joined table
    re-created without a column the query reads: each is a permanent error naming it."""
    run("customers", "INSERT INTO {t} VALUES (50, 'one', 1), (50, 'two', 1)")
    run("orders", "INSERT INTO {t} VALUES (8, 50, 1.0)")  # two rows of order 8, none held
    with pytest.raises(IterationFailed, match="not unique in its table"):
        driver.tail(latest_version(spark, paths["orders"]))
    run("customers", "DELETE FROM {t} WHERE id = 50")
    run("customers", "INSERT INTO {t} VALUES (40, 'twin', 2)")
    with pytest.raises(IterationFailed, match="not unique in its table") as failed:
        driver.tail(latest_version(spark, paths["orders"]))
    assert failed.value.code == ErrorCode.CONSUMER_FAILED
    run("customers", "DELETE FROM {t} WHERE name = 'twin'")
    shutil.rmtree(paths["regions"])  # re-created without the column the query reads
    cdf_table(spark, paths["regions"], "id INT, name STRING")
    with pytest.raises(IterationFailed, match="no longer reads its tables") as failed:
        driver.tail(latest_version(spark, paths["orders"]))
    assert failed.value.code == ErrorCode.SOURCE_SCHEMA_CHANGED


def coded(spark: SparkSession, warehouse: str, join: str) -> HandDriven:
    """A join view of ``j.orders`` with ``j.codes`` on the order's code, hand-driven."""
    query = f"SELECT o.id, c.label FROM j.orders AS o {join} j.codes AS c ON o.code = c.id"
    options = {"query": query, "keys": {"o": ["id"], "c": ["id"]}}
    return HandDriven(
        spark,
        warehouse,
        JobKey(1, "j", "orders", "coded"),
        {"type": "join_view", "options": options},
    )


def labels(driver: HandDriven) -> list[tuple[Any, ...]]:
    """The view's (id, label) rows, in order."""
    return sorted(map(tuple, driver.read().select("id", "label").collect()), key=str)


def test_keys_joined_across_types_keep_every_row_they_meet(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A dimension keyed by a string joined on an integer: Spark casts, so two distinct
    keys ('1' and '01') meet one order, and the view holds two rows of it although
    every join is on its table's key. Both are kept, and the one whose key goes is
    deleted alone."""
    warehouse = str(tmp_path / "warehouse")
    orders, codes = f"{warehouse}/j/orders", f"{warehouse}/j/codes"
    cdf_table(spark, orders, "id INT, code INT")
    cdf_table(spark, codes, "id STRING, label STRING")
    spark.sql(f"INSERT INTO delta.`{orders}` VALUES (1, 1), (2, 2)")
    spark.sql(f"INSERT INTO delta.`{codes}` VALUES ('1', 'one'), ('01', 'uno'), ('2', 'two')")
    driver = coded(spark, warehouse, "JOIN")

    def check(*rows: tuple[int, str | None]) -> None:
        assert labels(driver) == sorted(rows, key=str)

    driver.snapshot(latest_version(spark, orders))
    check((1, "one"), (1, "uno"), (2, "two"))
    spark.sql(f"DELETE FROM delta.`{codes}` WHERE id = '01'")
    driver.tail(latest_version(spark, orders))
    check((1, "one"), (2, "two"))
    spark.sql(f"UPDATE delta.`{codes}` SET label = 'eins' WHERE id = '1'")
    spark.sql(f"INSERT INTO delta.`{codes}` VALUES ('001', 'un')")
    driver.tail(latest_version(spark, orders))
    check((1, "eins"), (1, "un"), (2, "two"))


def widening(
    spark: SparkSession, tmp_path: Path, orders: tuple[str, str], codes: tuple[str, str]
) -> tuple[HandDriven, str, str]:
    """``coded`` LEFT JOIN over orders and codes of the given code and key types and
    rows, the codes' types widenable in place; with the two tables' paths."""
    warehouse = str(tmp_path / "warehouse")
    paths = f"{warehouse}/j/orders", f"{warehouse}/j/codes"
    cdf_table(spark, paths[0], f"id INT, code {orders[0]}")
    cdf_table(spark, paths[1], f"id {codes[0]}, label STRING")
    spark.sql(
        f"ALTER TABLE delta.`{paths[1]}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')"
    )
    spark.sql(f"INSERT INTO delta.`{paths[0]}` VALUES {orders[1]}")
    spark.sql(f"INSERT INTO delta.`{paths[1]}` VALUES {codes[1]}")
    return coded(spark, warehouse, "LEFT JOIN"), *paths


def test_a_joined_key_widened_under_the_job_keeps_the_view_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A dimension's key widened in place (Delta's type widening, INT to BIGINT), then
    changed: the view comes out as the query says, read across the widening or
    recomputed whole where Delta refuses the change feed across it."""
    driver, orders, codes = widening(
        spark,
        tmp_path,
        ("BIGINT", "(1, 1), (2, 2), (3, 3000000000)"),
        ("INT", "(1, 'one'), (2, 'two')"),
    )

    def check(*rows: tuple[int, str | None]) -> None:
        assert labels(driver) == sorted(rows, key=str)

    driver.snapshot(latest_version(spark, orders))
    check((1, "one"), (2, "two"), (3, None))
    spark.sql(f"ALTER TABLE delta.`{codes}` ALTER COLUMN id TYPE BIGINT")
    spark.sql(f"INSERT INTO delta.`{codes}` VALUES (3000000000, 'big')")
    spark.sql(f"UPDATE delta.`{codes}` SET label = 'uno' WHERE id = 1")
    driver.tail(latest_version(spark, orders))
    check((1, "uno"), (2, "two"), (3, "big"))


def test_a_key_compared_across_types_widened_under_the_job_keeps_the_view_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Without ANSI mode, an INT code joined on a FLOAT key is compared as FLOAT, where
    16777217 rounds to 16777216 and meets its row; widened in place to DOUBLE, the key
    is compared as DOUBLE and no longer does. No row of either table changes, so the
    change feeds say nothing: the view is recomputed because a column it reads changed
    type."""
    driver, orders, codes = widening(
        spark,
        tmp_path,
        ("INT", "(1, 16777216), (2, 16777217)"),
        ("FLOAT", "(CAST(16777216 AS FLOAT), 'big')"),
    )
    with session_confs(spark, {"spark.sql.ansi.enabled": "false"}):
        driver.snapshot(latest_version(spark, orders))
        assert labels(driver) == [(1, "big"), (2, "big")]
        spark.sql(f"ALTER TABLE delta.`{codes}` ALTER COLUMN id TYPE DOUBLE")
        driver.tail(latest_version(spark, orders))
        assert labels(driver) == [(1, "big"), (2, None)]
