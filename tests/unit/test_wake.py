"""Micro-batches on demand: when the next one is wanted, and what the waker does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lakeprop.config import AppConfig, ClusterConfig, KafkaConfig
from lakeprop.engine.dirty import DirtyTables
from lakeprop.engine.triggers import JobView, eligible_at
from lakeprop.service.carry_over import Carried, carry_over, starting_offsets
from lakeprop.service.wake import Waker, next_batch_at, wake_topic
from lakeprop.spec import TriggerKind
from lakeprop.tables.hadoop import LocalFiles


def test_work_with_a_time_runs_at_its_time_but_at_most_once_a_tick() -> None:
    assert next_batch_at(100.0, 5.0, 1.0, False, []) == math.inf
    assert next_batch_at(100.0, 5.0, 1.0, False, [130.0, 160.0]) == 130.0
    assert next_batch_at(100.0, 5.0, 1.0, False, [101.0]) == 105.0  # not before the tick
    assert next_batch_at(100.0, 5.0, 1.0, False, [50.0]) == 105.0  # overdue: the next tick


def test_work_of_every_tick_is_woken_one_poll_early_to_start_on_the_tick() -> None:
    assert next_batch_at(100.0, 5.0, 1.0, True, [130.0]) == 104.0
    assert next_batch_at(100.0, 1.0, 1.0, True, []) == 100.0  # at once: Spark polls each second


def job(**kw: object) -> JobView:
    return JobView(ref="k", job_id=1, **kw)  # type: ignore[arg-type]


def test_a_job_is_held_back_by_its_retry_and_its_period_only() -> None:
    assert eligible_at(job(kind=TriggerKind.DEFAULT, watermark=3)) is None
    assert eligible_at(job(kind=TriggerKind.DEFAULT, watermark=3, blocked_until=50.0)) == 50.0
    periodic = {"kind": TriggerKind.PERIODIC, "interval_s": 60.0, "watermark": 3}
    assert eligible_at(job(**periodic, watermark_ts=100.0)) == 160.0
    assert eligible_at(job(**periodic, watermark_ts=100.0, blocked_until=200.0)) == 200.0
    assert eligible_at(job(**periodic, watermark_ts=None)) is None
    # only an event frees these: a finished iteration, an update of the spec
    assert eligible_at(job(kind=TriggerKind.DEFAULT, in_flight=True, blocked_until=50.0)) is None
    assert eligible_at(job(kind=TriggerKind.DEFAULT, failed=True, blocked_until=50.0)) is None


def test_a_tables_sweep_time_is_known_once_it_was_probed() -> None:
    dirty = DirtyTables(sweep_interval=100.0)
    assert dirty.next_sweep(("d", "t")) == 0.0  # never probed: due now
    dirty.probed(("d", "t"), 3, started=1000.0)
    assert 1075.0 <= dirty.next_sweep(("d", "t")) <= 1100.0


def test_the_wake_topic_is_the_querys_own() -> None:
    config = AppConfig(kafka=KafkaConfig(topic="log"), query_name="my query")
    assert wake_topic(config) == "log.wake.my-query"
    clustered = AppConfig(
        kafka=KafkaConfig(topic="log"), cluster=ClusterConfig(enabled=True, instance_id="node-2")
    )
    assert wake_topic(clustered) == "log.wake.lakeprop-changelog.node-2"
    named = AppConfig(kafka=KafkaConfig(topic="log", wake_topic="mine"))
    assert wake_topic(named) == "mine"


def test_the_waker_writes_one_wake_at_a_time_and_counts_quiet_ticks() -> None:
    waker = Waker(KafkaConfig(), "wake", tick=5.0)
    assert waker.decide(0.0) == (True, 5.0, False)  # a start wants a micro-batch at once
    assert waker.decide(1.0) == (False, 5.0, False)  # outstanding: no second record
    waker.batch_started()
    waker.nudge()  # an iteration finished during the micro-batch: it may have missed it
    assert waker.decide(2.0) == (True, 5.0, False)
    waker.batch_started()
    assert waker.decide(2.5) == (False, 5.0, False)  # in a micro-batch, nothing is due
    waker.batch_ended(wanted_at=100.0)
    assert waker.decide(3.0) == (False, 5.0, True)  # quiet: look again in a tick
    waker.passed(8.0)
    assert waker.quiet_ticks == 1
    assert waker.decide(97.0) == (False, 3.0, True)  # the wanted time is nearer than a tick
    waker.passed(100.0)
    assert waker.quiet_ticks == 1  # the wanted time came: not quiet
    assert waker.decide(100.0) == (True, 5.0, False)


def write_offsets(checkpoint: Path, batch: int, *sources: object) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0}), *map(json.dumps, sources)]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


def commit(checkpoint: Path, batch: int) -> None:
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits" / str(batch)).write_text("v1\n{}")


def test_a_checkpoint_of_the_tick_source_is_carried_over_from_its_last_commit(
    tmp_path: Path,
) -> None:
    files, root = LocalFiles(), str(tmp_path)
    write_offsets(tmp_path, 0, {"log": {"0": 2, "1": 0}}, {"offset": 1, "timestamp": 1})
    commit(tmp_path, 0)
    write_offsets(tmp_path, 1, {"log": {"0": 5, "1": 4}}, {"offset": 2, "timestamp": 2})
    (tmp_path / "metadata").write_text('{"id":"q"}')  # batch 1 was planned, not committed

    carried = carry_over(files, root, "log")

    assert carried == Carried({0: 2, 1: 0})  # batch 1 is read again, as a restart would
    assert json.loads((tmp_path / "carried-over.json").read_text()) == {"offsets": {"0": 2, "1": 0}}
    assert sorted(p.name for p in (tmp_path / "tick-source").iterdir()) == [
        "commits",
        "metadata",
        "offsets",
    ]
    assert not (tmp_path / "offsets").exists()
    assert carry_over(files, root, "log") == carried  # the new query did not start yet
    assert starting_offsets(carried, [0, 1, 2]) == {0: 2, 1: 0, 2: -2}  # 2 is new
    write_offsets(tmp_path, 0, {"log": {"0": 2, "1": 0}}, {"log.wake": {"0": 7}})
    assert carry_over(files, root, "log") is None  # the new query's checkpoint


def test_a_carry_over_cut_short_is_finished_with_the_offsets_it_wrote(tmp_path: Path) -> None:
    files, root = LocalFiles(), str(tmp_path)
    write_offsets(tmp_path, 0, {"log": {"0": 3}}, {"offset": 1, "timestamp": 1})
    commit(tmp_path, 0)
    (tmp_path / "carried-over.json").write_text(json.dumps({"offsets": {"0": 3}}))
    (tmp_path / "tick-source").mkdir()
    (tmp_path / "commits").rename(tmp_path / "tick-source" / "commits")  # then it stopped

    assert carry_over(files, root, "log") == Carried({0: 3})
    assert sorted(p.name for p in (tmp_path / "tick-source").iterdir()) == ["commits", "offsets"]


def test_a_tick_checkpoint_without_a_committed_batch_starts_where_the_config_says(
    tmp_path: Path,
) -> None:
    write_offsets(tmp_path, 0, {"log": {"0": 3}}, {"offset": 1, "timestamp": 1})
    carried = carry_over(LocalFiles(), str(tmp_path), "log")
    assert carried == Carried(None)
    assert starting_offsets(carried, [0]) is None


@pytest.mark.parametrize("layout", ["new", "none"])
def test_other_checkpoints_are_left_alone(tmp_path: Path, layout: str) -> None:
    if layout == "new":
        write_offsets(tmp_path, 0, {"log": {"0": 3}}, {"log.wake": {"0": 1}})
    assert carry_over(LocalFiles(), str(tmp_path), "log") is None
    assert not (tmp_path / "tick-source").exists()
