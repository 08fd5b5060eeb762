"""Accounts as tenants: their share of the workers, their quotas, their scope.

Every job key carries an ``account_id``. The ``[tenants]`` section of the
config gives each account

* a **weight**: its share of the workers when accounts compete for them (the
  scheduler's fair-share policy, :class:`lakeprop.engine.policy.FairShare`);
* **quotas**: live jobs (a register over it is rejected), concurrent
  iterations, and change rows per tail iteration (its own bound of chunked
  catch-up, instead of ``engine.max_rows_per_iteration``);
* a **budget** of rows in flight: the rows its running iterations hold cached.
  Above 80 % of it the account's new iterations wait, until under 50 %
  (backpressure, as TiCDC's memory control);
* a **scope**: the databases (glob patterns, ``sales_*``) its jobs may read as
  sources and write as targets. A register or update outside it is rejected.

Whatever the scope, a consumer's target is never a table another account's
live job reads or writes, nor one of the service's own state tables.

Accounts not listed under ``[tenants.accounts]`` get the section's own values,
and a listed account inherits each value it does not set. The defaults are
open: weight 1, no quota, any database. This module is policy only (no Spark):
the catalog asks :meth:`Tenants.admit` before it registers or re-specifies a
job, and the scheduler asks for weights and caps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from lakeprop.config import TenantLimits, TenantsConfig
from lakeprop.errors import ErrorCode, TenantError, UnknownConsumerError
from lakeprop.registry import get_consumer_type
from lakeprop.spec import JobKey, JobSpec, target_table

Table = tuple[str, str]
"""(database, table)"""


def lowered(table: Table) -> Table:
    return table[0].lower(), table[1].lower()


@dataclass
class Census:
    """Who uses what among the live jobs: live jobs per account, and which account
    each source and target table belongs to. Kept current while a micro-batch's
    commands are applied, so each admission costs a few dictionary lookups."""

    live: dict[int, int] = field(default_factory=dict)
    owners: dict[Table, set[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, jobs: Iterable[tuple[JobKey, JobSpec]]) -> Census:
        census = cls()
        for key, spec in jobs:
            census.add(key, spec)
        return census

    @staticmethod
    def _tables(key: JobKey, spec: JobSpec) -> tuple[Table, ...]:
        """A job's source, the tables it joins and its target, by lower-case name (as
        Spark compares them)."""
        consumer = spec.iteration.consumer
        target = target_table(key, consumer.options)
        try:
            joined = get_consumer_type(consumer.type).joined_sources(consumer.options)
        except UnknownConsumerError:
            joined = []
        return (
            lowered((key.database, key.table)),
            *(lowered((j.database, j.table)) for j in joined),
            lowered(target),
        )

    def add(self, key: JobKey, spec: JobSpec) -> None:
        self.live[key.account_id] = self.live.get(key.account_id, 0) + 1
        for table in self._tables(key, spec):
            self.owners.setdefault(table, set()).add(key.account_id)

    def remove(self, key: JobKey) -> None:
        """Forget one live job. Its tables stay owned by its account: another job of
        the account may use them, and a stale owner only makes the check stricter
        until the next micro-batch counts afresh."""
        self.live[key.account_id] = self.live.get(key.account_id, 1) - 1


class Tenants:
    """The ``[tenants]`` config, resolved per account."""

    def __init__(
        self,
        config: TenantsConfig | None = None,
        reserved: Callable[[str, str], bool] = lambda _database, _table: False,
    ) -> None:
        self.config = config or TenantsConfig()
        self.reserved = reserved
        """Whether (database, table) is one of the service's own state tables."""
        self._resolved: dict[int, TenantLimits] = {}

    def of(self, account_id: int) -> TenantLimits:
        limits = self._resolved.get(account_id)
        if limits is None:
            limits = self._resolved[account_id] = self.config.limits(account_id)
        return limits

    def weight(self, account_id: int) -> float:
        return self.of(account_id).weight

    def max_concurrent(self, account_id: int) -> int:
        return self.of(account_id).max_concurrent_iterations

    def budget(self, account_id: int) -> int:
        """Rows the account's running iterations may hold cached (0: no budget)."""
        return self.of(account_id).max_rows_in_flight

    def max_rows(self, account_id: int, engine_bound: int) -> int:
        """Change rows one tail iteration of the account may read (0: no bound)."""
        return self.of(account_id).max_rows_per_iteration or engine_bound

    def admit(
        self,
        key: JobKey,
        spec: JobSpec,
        census: Census,
        *,
        new_job: bool,
        keeps_target: bool = False,
    ) -> None:
        """Raise TenantError when the job may not exist with this spec: a source or
        target outside the account's scope, a target that belongs to another
        account or to the service, or (a new job) over the account's live-job
        quota. The first of these that applies is the reason. An update that
        ``keeps_target`` (the job writes it already) is never refused for the
        other accounts that have come to read that target since."""
        tenant = self.of(key.account_id)
        target = target_table(key, spec.iteration.consumer.options)
        joined = get_consumer_type(spec.iteration.consumer.type).joined_sources(
            spec.iteration.consumer.options
        )
        roles = [
            ("source", key.database),
            *((f"joined table {j.name}", j.database) for j in joined),
            ("target", target[0]),
        ]
        for role, database in roles:
            if not tenant.may_use(database):
                raise TenantError(
                    f"account {key.account_id} may not use database {database!r} "
                    f"(its {role}); its scope is {list(tenant.databases)}",
                    ErrorCode.OUT_OF_SCOPE,
                )
        if self.reserved(*target):
            raise TenantError(
                f"target {target[0]}.{target[1]} is one of lakeprop's own state tables",
                ErrorCode.TARGET_NOT_ALLOWED,
            )
        others = census.owners.get(lowered(target), set()) - {key.account_id}
        if others and not keeps_target:
            raise TenantError(
                f"target {target[0]}.{target[1]} belongs to another account "
                f"(a table its jobs read or write)",
                ErrorCode.TARGET_NOT_ALLOWED,
            )
        if new_job and tenant.max_live_jobs:
            live = census.live.get(key.account_id, 0)
            if live >= tenant.max_live_jobs:
                raise TenantError(
                    f"account {key.account_id} has {live} live job(s), its quota "
                    f"(max_live_jobs = {tenant.max_live_jobs}); unregister one first",
                    ErrorCode.QUOTA_EXCEEDED,
                )
