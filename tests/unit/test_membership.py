"""Slots, the model of the cooperative-sticky assignor, the group protocols' settings
(no broker needed)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import pytest
from confluent_kafka import TopicPartition

from lakeprop.changelog import Command, LogRecord, Operation
from lakeprop.config import ClusterConfig, KafkaConfig
from lakeprop.engine.ownership import FENCE_VERSION, SlotOwner, SoleOwner
from lakeprop.engine.takeover import take_over
from lakeprop.errors import InvalidConfigError
from lakeprop.membership.assignment import movement, owners, sticky
from lakeprop.membership.group import Seat, boot_clock
from lakeprop.membership.protocol import consumer_settings, group_configs
from lakeprop.membership.slots import owned_tables, slot_of, tables_by_slot
from lakeprop.membership.topics import Claim, _unreleased
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import apply_commands
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.status import JobState


def test_a_table_always_hashes_onto_the_same_slot_and_tables_spread_over_all() -> None:
    assert slot_of("sales", "orders", 64) == slot_of("sales", "orders", 64)
    assert slot_of("sales", "orders", 64) != slot_of("sales", "order", 64) or slot_of(
        "a", "b", 64
    ) != slot_of("a", "c", 64)
    # the name's parts are kept apart: ("a.b", "c") is not ("a", "b.c")
    spread = tables_by_slot(((f"db{i % 7}", f"t{i}") for i in range(6400)), 64)
    assert sorted(spread) == list(range(64))
    assert max(len(t) for t in spread.values()) < 2 * 100
    assert owned_tables([3], spread) == sorted(spread[3])


def test_the_model_is_balanced_and_keeps_what_it_can() -> None:
    first = sticky({}, ["a", "b", "c"], 64)
    assert sorted(len(s) for s in first.values()) == [21, 21, 22]
    assert set().union(*first.values()) == set(range(64))
    # a fourth member takes a quarter; nobody else's slots move
    second = sticky(first, ["a", "b", "c", "d"], 64)
    assert sorted(len(s) for s in second.values()) == [16, 16, 16, 16]
    for m in "abc":
        assert second[m] <= first[m]
    # a member leaves: only its slots move, and the rest stay balanced
    third = sticky(second, ["a", "b", "d"], 64)
    assert sorted(len(s) for s in third.values()) == [21, 21, 22]
    for m in "abd":
        assert second[m] <= third[m]
    assert {s for s, o in owners(third).items() if o != owners(second).get(s)} == second["c"]


@pytest.mark.parametrize("instances", [10, 100])
def test_a_join_or_a_leave_moves_at_most_a_fair_share_of_tables(instances: int) -> None:
    slots = 4096
    rng = random.Random(7)
    per_slot = [0] * slots
    for i in range(100_000):
        per_slot[slot_of(f"db{rng.randrange(50)}", f"t{i}", slots)] += 1
    names = [f"i{n}" for n in range(instances)]
    before = sticky({}, names, slots)
    joined = movement(before, sticky(before, [*names, "new"], slots), per_slot)
    left = movement(before, sticky(before, names[1:], slots), per_slot)
    for change in (joined, left):
        assert change.moved_share <= 1 / change.members_after + 0.10
        assert change.imbalance <= 1.15  # tables hash at random: ~3 % spread per instance


def test_cluster_settings_are_checked() -> None:
    assert ClusterConfig().instance()
    assert ClusterConfig(topic="t").members_topic("log") == "t"
    assert ClusterConfig().members_topic("log") == "log.members"
    for bad in (
        {"instance_id": "../etc"},
        {"slots": 0},
        {"heartbeat_interval": 5.0, "session_timeout": 6.0},
        {"topic": "a topic"},
        {"group_protocol": "stream"},
    ):
        with pytest.raises(InvalidConfigError):
            ClusterConfig(**bad)  # type: ignore[arg-type]


def test_each_group_protocol_gets_its_own_consumer_settings() -> None:
    classic = ClusterConfig(session_timeout=12.0, heartbeat_interval=2.0)
    assert consumer_settings(classic, "i1", "g") == {
        "group.id": "g",
        "client.id": "i1",
        "enable.auto.commit": False,
        "auto.offset.reset": "latest",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 12000,
        "heartbeat.interval.ms": 2000,
    }
    assert group_configs(classic) == {}
    # KIP-848: librdkafka refuses the assignor and the timings; they are the group's
    kip848 = replace(classic, group_protocol="consumer", static_membership=True)
    assert consumer_settings(kip848, "i1", "g") == {
        "group.id": "g",
        "client.id": "i1",
        "enable.auto.commit": False,
        "auto.offset.reset": "latest",
        "group.instance.id": "i1",
        "group.protocol": "consumer",
    }
    assert group_configs(kip848) == {
        "consumer.session.timeout.ms": "12000",
        "consumer.heartbeat.interval.ms": "2000",
    }


# -- taking a slot's jobs over ---------------------------------------------------------


def _row(job_id: int, offset: int, watermark: int | None, **changes: object) -> CatalogRow:
    (row,) = apply_commands(
        [],
        [Command(Operation.REGISTER, "r", JobKey(1, "db", f"t{job_id}", "j"), _rec(0), spec=SPEC)],
        _ok,
    ).upserts.values()
    row = replace(row, job_id=job_id, log_offset=offset, watermark=watermark)
    return replace(row, **changes)


def _rec(offset: int) -> LogRecord:
    return LogRecord("log", 0, offset, datetime(2026, 11, 1), None, None)


def _ok(key: JobKey, spec: JobSpec) -> str:
    return "id"


SPEC = JobSpec.from_json(
    {
        "trigger": {"kind": "greedy"},
        "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
    }
)


def test_a_take_over_keeps_whichever_view_applied_the_later_message() -> None:
    level = _row(1, 5, 9)
    behind_mem = _row(2, 5, 3)
    ahead_mem = _row(3, 8, 3, job_state=JobState.PAUSED)
    restarted = _row(4, 8, None)
    only_mem = _row(5, 9, None)
    dropped_mem = _row(6, 9, 4, drop_at=datetime(2026, 11, 2))
    durable = [
        _row(1, 5, 9),
        _row(2, 7, 12),  # the old owner applied a later message and went on
        _row(3, 6, 20),  # memory paused it later; the old owner got to 20
        _row(
            4,
            6,
            20,
            job_spec=JobSpec.from_json(
                {
                    "trigger": {"kind": "greedy"},
                    "iteration": {
                        "consumer": {"type": "replica", "options": {"primary_key": ["k"]}}
                    },
                }
            ).canonical(),
        ),
        _row(7, 3, 1),  # memory never heard of it
    ]
    decided = take_over([level, behind_mem, ahead_mem, restarted, only_mem, dropped_mem], durable)
    assert {r.job_id: r.watermark for r in decided.durable} == {1: 9, 2: 12, 7: 1}
    assert {r.job_id: (r.watermark, r.job_state) for r in decided.ahead} == {
        3: (20, JobState.PAUSED),  # memory's message, the old owner's progress
        4: (None, JobState.COMPLETED),  # a new consumer restarts the job: no watermark
        5: (None, JobState.COMPLETED),  # registered, never written
    }
    assert decided.gone == [dropped_mem.row_id]


# -- the seat's self-fence and the handover between threads ------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _seat(clock: Clock) -> Seat:
    seat = Seat(KafkaConfig(), ClusterConfig(slots=8, session_timeout=6.0), clock=clock)
    seat._claims = {3: Claim(3, 41), 5: Claim(5, 7)}
    seat._suspect = False
    seat._last_tick = clock.now
    return seat


def test_a_seat_paused_near_its_session_timeout_holds_nothing_until_confirmed() -> None:
    clock = Clock()
    seat = _seat(clock)  # session 6 s, heartbeats every second: a 4 s gap is suspect
    clock.now += 3.9
    assert seat.holds(3) and seat.may_write(5) == Claim(5, 7) and not seat.holds(4)
    seat._tick()
    clock.now += 4.1  # paused: a thread that runs first sees the gap before the clock thread
    assert not seat.holds(3) and seat.may_write(5) is None and seat.claims() == {}
    seat._tick()  # the clock thread sees it too, and the seat stays suspect
    assert seat._suspect and not seat.holds(3)
    assert seat.assigned() == {3, 5}  # still assigned as far as it knows: its rows wait


def test_a_revoked_slot_is_drained_by_the_batch_thread_before_the_seat_lets_it_go() -> None:
    clock = Clock()
    seat = _seat(clock)
    owner = SlotOwner(seat, drain_timeout=30.0)
    pending = owner.pending()
    assert set(pending.gained) == {3, 5} and not pending.revoking
    owner.adopt(pending.gained)
    assert owner.writes_slot(3) and owner.sign("db", "t") is not None
    seat._draining.add(3)
    revoking = threading.Thread(target=owner._revoke, args=(frozenset({3}),))
    revoking.start()
    wait_until(lambda: owner.pending().revoking == {3})
    assert revoking.is_alive()  # the seat's thread waits for the drain
    assert owner.writes_slot(3) and not seat.holds(3)  # results may still be recorded
    owner.drained({3})
    revoking.join(10)
    assert not revoking.is_alive() and not owner.writes_slot(3) and owner.writes_slot(5)
    # a lost slot is simply gone; the next micro-batch cancels what ran on it
    owner._lose(frozenset({5}))
    assert owner.pending().lost == {5} and not owner.writes_slot(5)


def test_signatures_grow_and_fence_versions_top_them() -> None:
    clock = Clock()
    owner = SlotOwner(_seat(clock))
    first, second = owner.sign(), owner.sign()
    assert first is not None and second is not None
    assert first.app_id == second.app_id and second.version > first.version
    assert second.version < FENCE_VERSION
    seat = _seat(clock)
    assert SoleOwner().sign() is None and SoleOwner().serves("any", "table")
    assert seat.writer != owner.seat.writer  # every seat writes under an id of its own


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_new_owner_fences_the_writers_not_released_before_its_claim() -> None:
    def claim(writer: str) -> dict[str, object]:
        return {"kind": "claim", "writer": writer}

    def release(writer: str, adopted: bool) -> dict[str, object]:
        return {"kind": "release", "writer": writer, "adopted": adopted}

    assert _unreleased([[claim("a"), release("a", True)]]) == []
    assert _unreleased([[claim("a")]]) == ["a"]  # dropped without a word
    # b gave the slot up before it fenced a: a may still write, b may not
    assert _unreleased([[claim("a"), claim("b"), release("b", False)]]) == ["a"]
    assert _unreleased([[claim("a"), release("a", True), claim("b"), claim("c")]]) == ["b", "c"]
    assert _unreleased([[claim("x")], [claim("y"), release("y", True)]]) == ["x"]


def test_a_drain_that_gives_up_is_released_as_unclean_so_the_next_owner_fences() -> None:
    clock = Clock()
    seat = _seat(clock)
    owner = SlotOwner(seat, drain_timeout=0.05)
    owner.adopt(owner.pending().gained)
    assert owner._revoke(frozenset({3})) == {3}  # nobody drained it in time
    owner.adopt({5})
    owner._revoking.add(5)
    owner.drained({5}, clean=False)  # drained, but an iteration did not end
    assert owner._revoke(frozenset({5})) == {5}

    written: list[tuple[list[int], dict[str, object]]] = []
    seat = _seat(clock)
    seat._adopted = {3, 5}
    seat._append = lambda slots, fields: written.append((slots, fields)) or {}  # type: ignore[method-assign]
    seat.on_revoke = lambda slots: frozenset({5})
    seat._revoked(None, [TopicPartition("m", 3), TopicPartition("m", 5)])
    assert written == [
        ([3], {"kind": "release", "adopted": True}),
        ([5], {"kind": "release", "adopted": False}),
    ]


def test_a_claim_the_broker_did_not_confirm_is_claimed_again_at_a_heartbeat() -> None:
    seat = _seat(Clock())
    seat._claims = {}
    landed = [{2: 10}, {4: 11}]
    seat._append = lambda slots, fields: landed.pop(0)  # type: ignore[method-assign]
    seat._assigned(None, [TopicPartition("m", 2), TopicPartition("m", 4)])
    assert seat.assigned() == {2} and seat._unclaimed == {4}
    seat._claim_again()
    assert seat.claims() == {2: Claim(2, 10), 4: Claim(4, 11)} and not seat._unclaimed


def test_the_pause_detector_counts_a_suspended_machine() -> None:
    """The seat's clock is the boot-time clock, which runs on while a VM is suspended
    (the monotonic clock stops)."""
    seat = Seat(KafkaConfig(), ClusterConfig(slots=8, session_timeout=6.0))
    assert seat.clock is boot_clock
    assert abs(boot_clock() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
