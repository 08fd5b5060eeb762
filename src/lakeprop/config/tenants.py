"""The ``[tenants]`` section: every account's limits, and one account's own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from fnmatch import fnmatchcase
from typing import Any

from lakeprop.errors import InvalidConfigError


@dataclass(frozen=True)
class TenantLimits:
    """An account's weight, quotas (0: none) and scope (empty: any database); see
    :mod:`lakeprop.tenants`."""

    weight: float = 1.0
    """An account's share of the workers when accounts compete."""
    max_live_jobs: int = 0
    """Live jobs per account: a register over it is rejected (10500); 0: none."""
    max_concurrent_iterations: int = 0
    """Iterations of one account running at once; 0: no bound."""
    max_rows_per_iteration: int = 0
    """An account's own bound of change rows per tail iteration; 0: the engine's."""
    max_rows_in_flight: int = 0
    """Backpressure: above 80 % of this many rows held by an account's running
    iterations its new iterations wait, until under 50 %; 0: none."""
    databases: tuple[str, ...] = ()
    """Databases (glob patterns) an account's jobs may read and write; empty: any."""

    def __post_init__(self) -> None:
        check_limits({f.name: getattr(self, f.name) for f in fields(TenantLimits)}, "tenants")

    def may_use(self, database: str) -> bool:
        return not self.databases or any(fnmatchcase(database, p) for p in self.databases)


@dataclass(frozen=True)
class TenantsConfig(TenantLimits):
    """The ``[tenants]`` section: the limits of every account, and under ``accounts``
    (keyed by account id) the values one account sets for itself; it inherits
    each value it does not set."""

    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per account id, the settings above that account sets for itself."""

    def __post_init__(self) -> None:
        super().__post_init__()
        known = {f.name for f in fields(TenantLimits)}
        for account, values in self.accounts.items():
            if not account.isdigit():
                raise InvalidConfigError(
                    f"tenants.accounts keys are account ids (0, 1, ...), got {account!r}"
                )
            unknown = sorted(set(values) - known)
            if unknown:
                raise InvalidConfigError(
                    f"unknown setting(s) {unknown} in tenants.accounts.{account}"
                )
            check_limits(values, f"tenants.accounts.{account}")

    def limits(self, account_id: int) -> TenantLimits:
        """The account's own values over the section's."""
        own = self.accounts.get(str(account_id), {})
        shared = {f.name: getattr(self, f.name) for f in fields(TenantLimits)}
        return TenantLimits(**{**shared, **own})


def account_values(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One account's own values as TOML gives them (TenantsConfig checks them)."""
    databases = values.get("databases", ())
    if not isinstance(databases, list | tuple):
        raise InvalidConfigError(f"{where}.databases must be a list")
    return {k: tuple(v) if k == "databases" else v for k, v in values.items()}


def check_limits(values: Mapping[str, Any], where: str) -> None:
    weight = values.get("weight")
    if weight is not None and (
        isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0
    ):
        raise InvalidConfigError(f"{where}.weight must be a positive number, got {weight!r}")
    for name in (
        "max_live_jobs",
        "max_concurrent_iterations",
        "max_rows_per_iteration",
        "max_rows_in_flight",
    ):
        value = values.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise InvalidConfigError(f"{where}.{name} must be 0 (none) or positive, got {value!r}")
    databases = values.get("databases")
    if databases is not None and (
        not isinstance(databases, tuple) or not all(isinstance(d, str) for d in databases)
    ):
        raise InvalidConfigError(f"{where}.databases must be a list of names or patterns")
