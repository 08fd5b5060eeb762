"""Which tables a tick probes with commit notifications on, and the notice format (no Spark)."""

from __future__ import annotations

import pytest

from lakeprop.config import load_config
from lakeprop.engine.dirty import DirtyTables
from lakeprop.errors import InvalidConfigError, InvalidMessageError
from lakeprop.notifications import CommitNotice

T = ("sales", "orders")
U = ("sales", "lines")
SWEEP = 60.0


def swept(dirty: DirtyTables, table: tuple[str, str], latest: int, at: float = 0.0) -> None:
    assert dirty.due(table, latest, at)
    dirty.probed(table, latest, at)


def test_every_table_is_probed_once_after_a_start_then_only_when_announced_or_swept() -> None:
    dirty = DirtyTables(SWEEP)
    swept(dirty, T, 5)
    swept(dirty, U, 3)
    assert not dirty.due(T, 5, 10.0)
    assert not dirty.due(U, 3, 10.0)
    dirty.announce(T, 6, at=11.0)
    assert dirty.due(T, 5, 12.0)
    assert not dirty.due(U, 3, 12.0)  # the other table stays idle
    dirty.reset()  # a restart: notices may have been missed
    assert dirty.due(T, 5, 13.0) and dirty.due(U, 3, 13.0)


def test_a_sweep_comes_within_the_interval_and_sweeps_are_spread() -> None:
    dirty = DirtyTables(SWEEP)
    tables = [("db", f"t{i}") for i in range(200)]
    for table in tables:
        swept(dirty, table, 1)
    assert not any(dirty.due(t, 1, 0.75 * SWEEP - 0.01) for t in tables)
    assert all(dirty.due(t, 1, SWEEP) for t in tables)
    due_at_90 = sum(dirty.due(t, 1, 0.9 * SWEEP) for t in tables)
    assert 0 < due_at_90 < len(tables)


def test_a_job_without_watermark_always_probes() -> None:
    dirty = DirtyTables(SWEEP)
    swept(dirty, T, 5)
    assert dirty.due(T, None, 1.0)


def test_an_announcement_at_or_below_the_watermark_changes_nothing() -> None:
    dirty = DirtyTables(SWEEP)
    swept(dirty, T, 5)
    dirty.announce(T, 5, at=1.0)
    dirty.announce(T, 4, at=1.0)
    assert not dirty.due(T, 5, 2.0)


def test_a_lagging_job_keeps_probing_until_it_reaches_what_was_seen() -> None:
    # a chunked catch-up, or a job that was in flight or backing off when the notice came
    dirty = DirtyTables(SWEEP)
    swept(dirty, T, 5)
    dirty.announce(T, 2000, at=1.0)
    dirty.probed(T, 2000, 2.0)  # the probe bears the notice out and consumes it
    assert dirty.due(T, 1005, 3.0)  # the first chunk ended at 1005
    assert dirty.due(T, 5, 3.0)
    assert not dirty.due(T, 2000, 3.0)


def test_a_notice_the_log_does_not_bear_out_is_dropped_unless_it_came_during_the_probe() -> None:
    dirty = DirtyTables(SWEEP)
    swept(dirty, T, 5)
    dirty.announce(T, 9, at=1.0)
    dirty.probed(T, 5, 2.0)  # begun after the notice: it claims a version the log lacks
    assert not dirty.due(T, 5, 3.0)
    dirty.announce(T, 6, at=4.0)
    dirty.probed(T, 5, 3.5)  # begun before the notice (the commit landed meanwhile)
    assert dirty.due(T, 5, 5.0)


def test_a_dropped_table_forgets_what_was_seen() -> None:
    dirty = DirtyTables(SWEEP)
    swept(dirty, T, 5)
    dirty.probed(T, None, 1.0)
    assert not dirty.due(T, 5, 2.0)


def test_notices_round_trip_and_bad_ones_say_what_is_wrong() -> None:
    notice = CommitNotice("sales", "orders", 42)
    key, value = notice.encode()
    assert key == b"sales.orders"
    assert CommitNotice.decode(value) == notice
    bad = {
        b"{": "not JSON",
        b"[]": "JSON object with version 1",
        b'{"version": 2}': "JSON object with version 1",
        b'{"version": 1, "database": "a", "table": "b", "table_version": -1}': ">= 0",
        b'{"version": 1, "database": "a", "table": "b", "table_version": true}': ">= 0",
        b'{"version": 1, "database": "a;drop", "table": "b", "table_version": 1}': "identifier",
        b'{"version": 1, "database": 3, "table": "b", "table_version": 1}': "must be a string",
    }
    for value, reason in bad.items():
        with pytest.raises(InvalidMessageError, match=reason):
            CommitNotice.decode(value)


def test_notifications_settings_are_validated() -> None:
    config = load_config(
        overrides={"notifications.enabled": "true", "notifications.sweep_interval": "2m"}
    )
    assert config.notifications.enabled and config.notifications.sweep_interval == 120.0
    assert not load_config().notifications.enabled
    with pytest.raises(InvalidConfigError, match=r"notifications\.topic"):
        load_config(overrides={"notifications.topic": "a b"})
    with pytest.raises(InvalidConfigError, match="sweep_interval"):
        load_config(overrides={"notifications.sweep_interval": "0s"})
