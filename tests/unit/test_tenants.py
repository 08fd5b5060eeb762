"""Tenants: per-account values, and the admission of jobs (quota, scope, targets)
as the catalog applies the change log, without Spark."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from lakeprop.config import TenantLimits, load_config
from lakeprop.errors import ErrorCode, InvalidConfigError
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import apply_commands
from lakeprop.state.outcomes import Outcome
from lakeprop.tenants import Tenants
from tests.unit.test_catalog_apply import check_ok, register, unregister, update


def spec(**options: object) -> JobSpec:
    return JobSpec.from_json(
        {
            "trigger": {"kind": "default"},
            "iteration": {
                "consumer": {
                    "type": "replica",
                    "options": {"primary_key": ["id"], **options},
                }
            },
        }
    )


def tenants(text: str, reserved: str = "") -> Tenants:
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as fh:
        fh.write(text)
        fh.flush()
        config = load_config(fh.name, environ={}).tenants
    return Tenants(config, reserved=lambda d, t: f"{d}.{t}" == reserved)


CONFIG = """
[tenants]
weight = 1
max_live_jobs = 2
databases = ["shared"]

[tenants.accounts.7]
weight = 4
max_concurrent_iterations = 3
max_rows_per_iteration = 5000
databases = ["sales", "sales_*"]

[tenants.accounts.8]
max_live_jobs = 0
"""


def test_an_account_inherits_what_it_does_not_set() -> None:
    t = tenants(CONFIG)
    assert t.of(7) == TenantLimits(4.0, 2, 3, 5000, 0, ("sales", "sales_*"))
    assert t.of(8) == TenantLimits(1.0, 0, 0, 0, 0, ("shared",))
    assert t.of(99) == TenantLimits(1.0, 2, 0, 0, 0, ("shared",))
    assert t.max_rows(7, 100) == 5000 and t.max_rows(8, 100) == 100


def test_the_defaults_are_open() -> None:
    assert Tenants().of(3) == TenantLimits()
    assert TenantLimits().may_use("anything")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tenants]\nweight = 0", "tenants.weight must be a positive number"),
        ("[tenants]\nmax_live_jobs = -1", "tenants.max_live_jobs must be 0 (none) or positive"),
        ("[tenants.accounts.x]\nweight = 2", "tenants.accounts keys are account ids"),
        (
            "[tenants.accounts.1]\ndatabases = 'sales'",
            "tenants.accounts.1.databases must be a list",
        ),
        ("[tenants.accounts.1]\nbogus = 1", "unknown setting(s) ['bogus']"),
        ("[tenants.accounts.1]\nweight = -2", "tenants.accounts.1.weight must be a positive"),
    ],
)
def test_bad_tenant_settings_are_named(text: str, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        tenants(text)


def verdicts(result: object) -> list[tuple[str | None, Outcome, int]]:
    return [(v.request_id, v.outcome, v.error_code) for v in result.verdicts]  # type: ignore[attr-defined]


def key(account: int, database: str, name: str, table: str = "t") -> JobKey:
    return JobKey(account, database, table, name)


def test_a_register_over_the_live_job_quota_is_rejected_and_an_unregister_frees_a_slot() -> None:
    t = tenants(CONFIG)
    a, b, c = (key(99, "shared", n) for n in "abc")
    result = apply_commands(
        [],
        [
            register(1, a, spec()),
            register(2, b, spec()),
            register(3, c, spec()),  # a third live job: over the quota of 2
            unregister(4, a),
            register(5, c, spec()),  # a slot is free again
        ],
        check_ok,
        tenants=t,
    )
    assert verdicts(result) == [
        ("r1", Outcome.APPLIED, 0),
        ("r2", Outcome.APPLIED, 0),
        ("r3", Outcome.REJECTED, ErrorCode.QUOTA_EXCEEDED),
        ("r4", Outcome.APPLIED, 0),
        ("r5", Outcome.APPLIED, 0),
    ]
    assert (
        "account 99 has 2 live job(s), its quota (max_live_jobs = 2)" in result.verdicts[2].detail
    )
    # the next micro-batch counts the live jobs from the rows: still full
    again = apply_commands(
        result.upserts.values(), [register(6, key(99, "shared", "d"), spec())], check_ok, tenants=t
    )
    assert verdicts(again) == [("r6", Outcome.REJECTED, ErrorCode.QUOTA_EXCEEDED)]
    # an account without a quota is not limited
    many = [register(10 + i, key(8, "shared", f"j{i}"), spec()) for i in range(5)]
    assert {v[1] for v in verdicts(apply_commands([], many, check_ok, tenants=t))} == {
        Outcome.APPLIED
    }


def test_sources_and_targets_outside_the_accounts_scope_are_rejected() -> None:
    t = tenants(CONFIG)
    result = apply_commands(
        [],
        [
            register(1, key(7, "sales_eu", "ok"), spec()),
            register(2, key(7, "finance", "src"), spec()),
            register(3, key(7, "sales", "tgt"), spec(target_database="finance")),
            register(4, key(7, "sales", "fine"), spec(target_database="sales_us")),
        ],
        check_ok,
        tenants=t,
    )
    assert verdicts(result) == [
        ("r1", Outcome.APPLIED, 0),
        ("r2", Outcome.REJECTED, ErrorCode.OUT_OF_SCOPE),
        ("r3", Outcome.REJECTED, ErrorCode.OUT_OF_SCOPE),
        ("r4", Outcome.APPLIED, 0),
    ]
    assert result.verdicts[1].detail == (
        "account 7 may not use database 'finance' (its source); its scope is ['sales', 'sales_*']"
    )
    assert "(its target)" in result.verdicts[2].detail
    # an update that moves the target out of scope is rejected too, the job unchanged
    moved = apply_commands(
        result.upserts.values(),
        [
            update(
                5,
                {"iteration": {"consumer": {"options": {"target_database": "finance"}}}},
                key(7, "sales_eu", "ok"),
            )
        ],
        check_ok,
        tenants=t,
    )
    assert verdicts(moved) == [("r5", Outcome.REJECTED, ErrorCode.OUT_OF_SCOPE)]
    assert moved.upserts == {}


def test_a_target_is_never_another_accounts_table_nor_the_services_own() -> None:
    t = tenants("", reserved="state.catalog")
    result = apply_commands(
        [],
        [
            register(1, key(1, "db", "copy", table="orders"), spec()),
            # account 2 writing account 1's source, or account 1's target
            register(2, key(2, "db", "x"), spec(target_table="orders")),
            register(3, key(2, "db", "y"), spec(target_table="orders_copy")),
            # account 1 may write its own tables; account 2 may read account 1's source
            register(4, key(1, "db", "more", table="items"), spec(target_table="orders_more")),
            register(5, key(2, "db", "own", table="orders"), spec(target_table="mine")),
            register(6, key(1, "state", "x"), spec(target_table="catalog")),
        ],
        check_ok,
        tenants=t,
    )
    assert verdicts(result) == [
        ("r1", Outcome.APPLIED, 0),
        ("r2", Outcome.REJECTED, ErrorCode.TARGET_NOT_ALLOWED),
        ("r3", Outcome.REJECTED, ErrorCode.TARGET_NOT_ALLOWED),
        ("r4", Outcome.APPLIED, 0),
        ("r5", Outcome.APPLIED, 0),
        ("r6", Outcome.REJECTED, ErrorCode.TARGET_NOT_ALLOWED),
    ]
    assert result.verdicts[1].detail == (
        "target db.orders belongs to another account (a table its jobs read or write)"
    )
    assert result.verdicts[5].detail == "target state.catalog is one of lakeprop's own state tables"


@pytest.mark.parametrize("name", ["cluster.toml", "databricks.toml"])
def test_the_shipped_configs_closed_example_is_valid(name: str) -> None:
    text = (Path(__file__).parents[2] / "conf" / name).read_text()
    lines = text[text.index("# Tenants") : text.index("[metrics]")].splitlines()[1:]
    example = "\n".join(line.removeprefix("# ") for line in lines if line.startswith("# "))
    t = tenants(example)
    assert t.of(1).databases == ("sales", "sales_*") and t.of(1).weight == 2.0
    assert t.of(3).databases == ("shared",) and t.of(3).max_live_jobs == 500
    assert not t.of(2).may_use("sales") and t.of(2).may_use("finance")
