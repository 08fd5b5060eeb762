"""The state reader's queries, run on tables held in memory: jobs with the watermarks
the history records, usage from an hour on, bulk operations, verdicts, waits."""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime

import pytest

from devkit.memscan import MemoryScan
from devkit.specs import job_row, replica_spec
from lakeprop.client.chains import PipelineReader
from lakeprop.client.log import Receipt
from lakeprop.client.reads import StateReader
from lakeprop.client.scans import Condition, Query
from lakeprop.config import StateConfig
from lakeprop.errors import (
    InvalidArgumentError,
    PermanentError,
    StateNotFoundError,
    TemporaryError,
)
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.history import consumer_digest
from lakeprop.state.job_row import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.status import JobState
from lakeprop.state.store import CATALOG_TABLE, HISTORY_TABLE, REQUESTS_TABLE, USAGE_TABLE
from lakeprop.state.usage import UsageRow

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 1, 9)
STATE = StateConfig(location="/state", checkpoint_location="/checkpoint")


def job(name: str, job_id: int, watermark: int | None, **changes: object) -> CatalogRow:
    row = job_row(JobKey(1, "shop", "items", name), job_id, watermark=watermark, at=T0)
    return replace(row, **changes)  # type: ignore[arg-type]


def catalog_row(row: CatalogRow) -> dict[str, object]:
    values = dict(zip(CATALOG_SCHEMA.fieldNames(), row.as_tuple(), strict=True))
    values["job_state"] = row.job_state.value
    return values


def run(to_version: int, ended: datetime, *members: tuple[int, int]) -> dict[str, object]:
    """A history row: its members as (job id, error code)."""
    digest = consumer_digest(replica_spec().iteration.consumer.canonical())
    return {
        "database": "shop",
        "table": "items",
        "to_version": to_version,
        "ended_at": ended,
        "members": [
            {"job_id": j, "error_code": code, "consumer_digest": digest} for j, code in members
        ],
    }


@pytest.fixture
def scan() -> MemoryScan:
    scan = MemoryScan()
    rows = [
        job("copy", 1, 3),
        job("idx", 2, None, job_state=JobState.ERROR),
        job("old", 3, 1, drop_at=T0),
    ]
    scan.write(STATE.table_path(CATALOG_TABLE), [catalog_row(r) for r in rows])
    scan.write(
        STATE.table_path(HISTORY_TABLE),
        [run(5, T0.replace(minute=5), (1, 0), (2, 10400)), run(7, T0.replace(minute=7), (1, 0))],
    )
    return scan


def test_jobs_come_with_the_watermarks_the_history_records(scan: MemoryScan) -> None:
    reader = StateReader(STATE, scan=scan)
    copy = reader.get_job_status(JobKey(1, "shop", "items", "copy"))
    assert copy is not None and (copy.watermark, copy.state) == (7, "completed")
    listed = reader.list_jobs()
    assert [(j.key.job_name, j.watermark, j.state) for j in listed] == [
        ("copy", 7, "completed"),
        ("idx", None, "error"),  # its failures count for nothing
    ]
    assert [j.key.job_name for j in reader.list_jobs(include_dropped=True)] == [
        "copy",
        "idx",
        "old",
    ]
    assert [j.key.job_name for j in reader.list_jobs(state="error")] == ["idx"]
    assert reader.list_jobs(account_id=2) == []


def test_a_job_s_status_carries_the_freshness_of_its_last_traced_write(scan: MemoryScan) -> None:
    traced = run(8, T0.replace(minute=9), (1, 0))
    traced["members"][0].update(origin_table="shop.raw", origin_at=T0.replace(minute=6))  # type: ignore[index]
    scan.write(STATE.table_path(HISTORY_TABLE), [traced])
    copy = StateReader(STATE, scan=scan).get_job_status(JobKey(1, "shop", "items", "copy"))
    assert copy is not None
    assert copy.freshness == {"origin": "shop.raw", "seconds": 180.0, "at": T0.replace(minute=9)}


def test_without_state_the_reader_says_where_it_looked() -> None:
    reader = StateReader(STATE, scan=MemoryScan())
    with pytest.raises(StateNotFoundError, match="no job catalog at /state/catalog"):
        reader.list_jobs()
    with pytest.raises(StateNotFoundError):
        reader.usage()


def test_usage_from_an_hour_on_and_outcomes_of_one_message(scan: MemoryScan) -> None:
    hours = [UsageRow(1, "shop", "items", "copy", 1, T0.replace(hour=h)) for h in (8, 9, 10)]
    scan.write(STATE.table_path(USAGE_TABLE), [asdict(u) for u in hours])
    reader = StateReader(STATE, scan=scan)
    assert reader.usage(since=T0.replace(minute=30)) == hours[1:]
    assert reader.usage(account_id=2) == []

    receipt = Receipt("r1", "log", 0, 11, T0)
    verdicts = [
        {"request_id": "r1", "topic": "log", "partition": 0, "offset": 11, "outcome": "applied"},
        {"request_id": "r1", "topic": "log", "partition": 0, "offset": 12, "outcome": "rejected"},
    ]
    scan.write(STATE.table_path(REQUESTS_TABLE), verdicts)
    assert reader.request_outcome("r1", replace(receipt, offset=12)) == verdicts[1]
    assert reader.request_outcome("r1") == verdicts[0]
    assert reader.wait_for_outcome(receipt, timeout=0) == verdicts[0]


def verdict(
    offset: int, op: str, job_id: int, detail: str, name: str = "late"
) -> dict[str, object]:
    return {
        **{"request_id": f"r{offset}", "topic": "log", "partition": 0, "offset": offset},
        **{"op": op, "account_id": 1, "database": "shop", "table": "items", "job_name": name},
        **{"job_id": job_id, "outcome": "applied", "detail": detail},
    }


def test_an_applied_verdict_is_waited_for_until_the_catalog_shows_its_message(
    scan: MemoryScan,
) -> None:
    """A verdict is written before its micro-batch's catalog commit: the wait returns an
    applied one once the job's row carries the message (or a later one)."""
    reader = StateReader(STATE, scan=scan)
    requests, catalog = STATE.table_path(REQUESTS_TABLE), STATE.table_path(CATALOG_TABLE)

    def wait(offset: int) -> dict[str, object]:
        return reader.wait_for_outcome(Receipt(f"r{offset}", "log", 0, offset, T0), timeout=0)

    registered = verdict(20, "register", 9, "registered")
    scan.write(requests, [registered])
    with pytest.raises(
        TemporaryError,
        match=r"r20 was applied, but the catalog did not show job 1/shop\.items/late written",
    ):
        wait(20)
    scan.write(catalog, [catalog_row(job("late", 8, None, log_offset=19))])  # another job
    with pytest.raises(TemporaryError, match="the catalog did not show job"):
        wait(20)
    scan.write(catalog, [catalog_row(job("late", 9, None, log_offset=20))])
    assert wait(20) == registered

    paused = verdict(21, "pause", 9, "paused")
    again = verdict(22, "pause", 9, "already paused")  # changes no row, found it paused
    scan.write(requests, [paused, again])
    with pytest.raises(TemporaryError, match="r22 was applied"):
        wait(22)  # the pause it found is in memory only, in the same micro-batch
    scan.write(catalog, [catalog_row(job("late", 9, None, log_partition=1, log_offset=40))])
    with pytest.raises(TemporaryError, match="r21 was applied"):
        wait(21)  # a row written from another partition says nothing of this one's order
    paused_row = job("late", 9, None, log_offset=21, job_state=JobState.PAUSED)
    scan.write(catalog, [catalog_row(paused_row)])
    assert (wait(21), wait(22)) == (paused, again)

    collected = verdict(30, "resync", 4, "resync from a snapshot", name="gone")
    scan.write(requests, [collected])  # its job's row is not there, nor its unregister
    with pytest.raises(TemporaryError, match="r30 was applied"):
        wait(30)
    dropped = verdict(31, "unregister", 4, "unregistered", name="gone")
    scan.write(requests, [dropped])  # the row was dropped and garbage-collected
    assert (wait(30), wait(31)) == (collected, dropped)


def test_a_wait_for_a_job_in_error_says_so(scan: MemoryScan) -> None:
    reader = StateReader(STATE, scan=scan)
    assert (
        reader.wait_for_watermark(JobKey(1, "shop", "items", "copy"), 6, timeout=0).watermark == 7
    )
    with pytest.raises(PermanentError, match="is in error"):
        reader.wait_for_watermark(JobKey(1, "shop", "items", "idx"), 6, timeout=0)


def test_a_query_keeps_the_columns_asked_and_explodes_a_list() -> None:
    rows = [{"a": 1, "b": None, "xs": [{"x": 2}, {"x": 3}]}, {"a": 0, "b": 5, "xs": []}]
    assert Query(("a",), order=("a",)).in_memory(rows) == [{"a": 0}, {"a": 1}]
    assert Query(("a", "xs"), (Condition("x", ">=", 3),), explode="xs").in_memory(rows) == [
        {"a": 1, "x": 3}
    ]
    assert Query(None, (Condition("b", "is null"),)).in_memory(rows) == [rows[0]]
    assert Query(None, (Condition("b", ">=", 0),)).in_memory(rows) == [rows[1]]  # NULL is no match


def test_a_wait_for_an_upstream_commit_follows_the_chain_in_each_job_s_versions() -> None:
    """items -> items_copy -> items_copy_totals: commit 4 of items reached ``totals``
    once ``copy`` consumed 4 (it left items_copy at 9, its current consumer's first
    write at or past 4) and ``totals`` consumed 9; a run of an earlier consumer of
    ``copy`` (before a resync) does not count."""
    copy_key, totals_key = (
        JobKey(1, "shop", "items", "copy"),
        JobKey(1, "shop", "items_copy", "totals"),
    )
    totals_spec = JobSpec.from_json(
        {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    )
    digest = consumer_digest(replica_spec().iteration.consumer.canonical())

    def wrote(to_version: int, left: int, consumer: str = digest) -> dict[str, object]:
        member = {"job_id": 1, "error_code": 0, "consumer_digest": consumer, "target_version": left}
        return {
            "database": "shop",
            "table": "items",
            "to_version": to_version,
            "ended_at": T0,
            "members": [member],
        }

    def reader(totals_at: int) -> PipelineReader:
        scan = MemoryScan()
        rows = [
            job_row(copy_key, 1, watermark=6, at=T0),
            job_row(totals_key, 2, watermark=totals_at, at=T0, spec=totals_spec),
        ]
        scan.write(STATE.table_path(CATALOG_TABLE), [catalog_row(r) for r in rows])
        history = [
            wrote(3, 7),
            wrote(4, 30, consumer="an earlier consumer"),
            wrote(5, 9),
            wrote(6, 11),
        ]
        scan.write(STATE.table_path(HISTORY_TABLE), history)
        return PipelineReader(STATE, scan=scan)

    assert reader(9).chain_between(("shop", "items"), totals_key) == [copy_key, totals_key]
    reached = reader(9).wait_for_origin(totals_key, ("Shop", "Items"), 4, timeout=0)
    assert reached.key == totals_key and reached.watermark == 9
    with pytest.raises(TemporaryError, match="did not reach version 9"):
        reader(8).wait_for_origin(totals_key, ("shop", "items"), 4, timeout=0)
    with pytest.raises(InvalidArgumentError, match=r"not downstream of shop\.other"):
        reader(9).wait_for_origin(totals_key, ("shop", "other"), 4, timeout=0)
