"""Builders of job specs and of the catalog rows they should produce."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lakeprop.changelog import LogRecord
from lakeprop.client.api import Receipt
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import job_id_for
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.status import EMPTY_STATUS, JobState


def replica_spec(**trigger: Any) -> JobSpec:
    return JobSpec.from_json(
        {
            "trigger": trigger or {"kind": "default"},
            "iteration": {
                "priority": 1,
                "consumer": {"type": "replica", "options": {"primary_key": ["id"]}},
            },
        }
    )


def expected_row(
    key: JobKey,
    spec: JobSpec,
    register: Receipt,
    table_id: str,
    *,
    last: Receipt | None = None,
    drop_at: datetime | None = None,
) -> CatalogRow:
    """The catalog row a register (and optionally a later message) should produce."""
    last = last or register
    record = LogRecord(
        register.topic, register.partition, register.offset, register.timestamp, None, None
    )
    return CatalogRow(
        account_id=key.account_id,
        database=key.database,
        table=key.table,
        job_name=key.job_name,
        job_id=job_id_for(record),
        table_id=table_id,
        job_spec=spec.canonical(),
        job_state=JobState.COMPLETED,
        watermark=None,
        watermark_ts=None,
        job_status=EMPTY_STATUS,
        create_at=register.timestamp,
        drop_at=drop_at,
        owner=None,
        log_partition=last.partition,
        log_offset=last.offset,
    )


def job_row(
    key: JobKey,
    job_id: int,
    *,
    watermark: int | None = None,
    at: datetime = datetime(2026, 11, 1),
    log_offset: int | None = None,
    spec: JobSpec | None = None,
) -> CatalogRow:
    """A live replica job's catalog row, for tests of what reads or moves rows."""
    return CatalogRow(
        account_id=key.account_id,
        database=key.database,
        table=key.table,
        job_name=key.job_name,
        job_id=job_id,
        table_id="tid",
        job_spec=(spec or replica_spec()).canonical(),
        job_state=JobState.COMPLETED,
        watermark=watermark,
        watermark_ts=at,
        job_status=EMPTY_STATUS,
        create_at=at,
        drop_at=None,
        owner=None,
        log_partition=0,
        log_offset=job_id if log_offset is None else log_offset,
    )
