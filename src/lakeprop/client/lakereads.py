"""The state tables read without Spark: what ``status``, ``list``, ``usage``,
``accounts`` and ``bulk status`` show, and the job a search looks up.

:class:`LakeStateReader` answers as :class:`~lakeprop.client.reads.StateReader`
does (same rows, same watermark roll-forward from the iteration history), from
delta-rs and Arrow (:mod:`lakeprop.client.lake`). Waits and notebooks keep the
Spark reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from lakeprop.bulk.model import BulkOperation, BulkTask
from lakeprop.client.lake import Lake
from lakeprop.client.reads import BulkStatus, JobInfo, by_key, current_row
from lakeprop.config import StateConfig, TablesConfig
from lakeprop.errors import InvalidConfigError, SourceTableError, StateNotFoundError
from lakeprop.spec import JobKey
from lakeprop.state.accounts import AccountRow
from lakeprop.state.catalog import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.history import rolled_forward
from lakeprop.state.status import JobState
from lakeprop.state.store import (
    ACCOUNTS_TABLE,
    BULK_OPERATIONS_TABLE,
    BULK_TASKS_TABLE,
    CATALOG_TABLE,
    HISTORY_TABLE,
    USAGE_TABLE,
)
from lakeprop.state.usage import UsageRow, hour_of

Reached = dict[tuple[int, str | None], tuple[int, datetime]]


class LakeStateReader:
    """The service's state tables under ``state.location``, read with delta-rs."""

    def __init__(
        self,
        state_config: StateConfig | None = None,
        storage_options: Mapping[str, str] | None = None,
        tables: TablesConfig | None = None,
    ) -> None:
        self.state = state_config or StateConfig()
        self.lake = Lake(storage_options)
        self.tables = tables

    def source_version(self, database: str, table: str) -> int:
        """The current Delta version of a path source table."""
        if self.tables is None or self.tables.resolution != "path":
            raise InvalidConfigError("reading a source without Spark needs path tables")
        path = f"{self.tables.warehouse.rstrip('/')}/{database}/{table}"
        if not self.lake.exists(path):
            raise SourceTableError(f"source {database}.{table} ({path}) is not a Delta table")
        return int(self.lake.open(path).version())

    def _path(self, name: str) -> str:
        return self.state.table_path(name)

    def _catalog_rows(self, where: Any = None) -> list[CatalogRow]:
        path = self._path(CATALOG_TABLE)
        if not self.lake.exists(path):
            raise StateNotFoundError(
                f"no job catalog at {path}: the service has not run with state.location "
                f"{self.state.location} yet (or the config points elsewhere)"
            )
        names = CATALOG_SCHEMA.fieldNames()
        return [CatalogRow.from_spark(r) for r in self.lake.rows(path, names, where)]

    def _reached(self, database: str | None = None, table: str | None = None) -> Reached:
        """Per job id and consumer digest: the highest version a successful member
        reached, and when (``IterationHistory.latest_success``)."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        path = self._path(HISTORY_TABLE)
        if not self.lake.exists(path):
            return {}
        where = None
        if database is not None and table is not None:
            where = (ds.field("database") == database) & (ds.field("table") == table)
        runs = self.lake.read(path, ["to_version", "ended_at", "members"], where)
        if runs.num_rows == 0:
            return {}
        members = runs.column("members").combine_chunks()
        parents = pc.list_parent_indices(members)
        flat = pc.list_flatten(members)
        names = {flat.type.field(i).name for i in range(flat.type.num_fields)}
        job_ids = flat.field("job_id").to_pylist()
        codes = flat.field("error_code").to_pylist()
        digests = (
            flat.field("consumer_digest").to_pylist()
            if "consumer_digest" in names
            else [None] * len(flat)
        )
        to_versions = pc.take(runs.column("to_version"), parents).to_pylist()
        ended = pc.take(runs.column("ended_at"), parents).to_pylist()
        reached: Reached = {}
        for job_id, code, digest, version, at in zip(
            job_ids, codes, digests, to_versions, ended, strict=True
        ):
            if code != 0:
                continue
            best = reached.get((job_id, digest))
            moment = at.astimezone().replace(tzinfo=None) if at.tzinfo else at
            if best is None or (version, moment) > best:
                reached[(job_id, digest)] = (version, moment)
        return reached

    def _with_progress(
        self, rows: list[CatalogRow], database: str | None = None, table: str | None = None
    ) -> list[CatalogRow]:
        if not any(r.is_live for r in rows):
            return rows
        reached = self._reached(database, table)
        return [rolled_forward(r, reached) or r for r in rows]

    def get_job_status(self, key: JobKey) -> JobInfo | None:
        """The live job with this key, or else its most recently dropped one."""
        import pyarrow.dataset as ds

        rows = self._catalog_rows(
            (ds.field("account_id") == key.account_id)
            & (ds.field("database") == key.database)
            & (ds.field("table") == key.table)
            & (ds.field("job_name") == key.job_name)
        )
        best = current_row(rows)
        if best is None:
            return None
        (best,) = self._with_progress([best], key.database, key.table)
        return JobInfo.from_row(best)

    def list_jobs(
        self,
        state: JobState | str | None = None,
        account_id: int | None = None,
        include_dropped: bool = False,
    ) -> list[JobInfo]:
        """Jobs, optionally of one state or one account, ordered by key."""
        import pyarrow.dataset as ds

        where = ds.scalar(True)
        if state is not None:
            where &= ds.field("job_state") == JobState(state).value
        if account_id is not None:
            where &= ds.field("account_id") == account_id
        if not include_dropped:
            where &= ds.field("drop_at").is_null()
        return by_key(self._with_progress(self._catalog_rows(where)))

    def usage(self, account_id: int | None = None, since: datetime | None = None) -> list[UsageRow]:
        """What jobs used, per job and hour (``StateReader.usage``)."""
        import pyarrow.dataset as ds

        self._catalog_rows(ds.scalar(False))  # no state at all: a clear error
        path = self._path(USAGE_TABLE)
        if not self.lake.exists(path):
            return []
        where = ds.scalar(True)
        if account_id is not None:
            where &= ds.field("account_id") == account_id
        rows = [
            UsageRow(**{k: v for k, v in r.items() if v is not None})
            for r in self.lake.rows(path, None, where)
        ]
        if since is not None:
            rows = [u for u in rows if u.hour >= hour_of(since)]
        return sorted(rows, key=lambda u: (u.hour, u.account_id, u.job_id))

    def accounts(self) -> list[AccountRow]:
        """Each account's load as the service last published it (``StateReader.accounts``)."""
        import pyarrow.dataset as ds

        self._catalog_rows(ds.scalar(False))
        path = self._path(ACCOUNTS_TABLE)
        if not self.lake.exists(path):
            return []
        return sorted((AccountRow(**r) for r in self.lake.rows(path)), key=lambda a: a.account_id)

    def bulk_status(self, bulk_id: str) -> BulkStatus | None:
        """A bulk operation with its tasks (``StateReader.bulk_status``)."""
        import pyarrow.dataset as ds

        self._catalog_rows(ds.scalar(False))
        operations, tasks = self._path(BULK_OPERATIONS_TABLE), self._path(BULK_TASKS_TABLE)
        if not self.lake.exists(operations):
            return None
        found = self.lake.rows(operations, None, ds.field("bulk_id") == bulk_id)
        if not found:
            return None
        matched = [
            BulkTask.from_row(r)
            for r in self.lake.rows(tasks, None, ds.field("bulk_id") == bulk_id)
        ]
        return BulkStatus(
            BulkOperation.from_row(found[0]), sorted(matched, key=lambda t: t.task_no)
        )
