"""Seats of the membership group on the test's broker (no Spark): a static
member restarted within its session timeout gets its slots back and moves none,
under Kafka's classic group protocol and under KIP-848's; a second process with
the same instance id leaves one of the two holding the slots (the coordinator
fences the older under the classic protocol, refuses the newer under KIP-848)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from devkit.waiting import assert_eventually
from lakeprop.config import ClusterConfig, KafkaConfig
from lakeprop.dev.localkafka import LocalKafka
from lakeprop.kafka import admin
from lakeprop.membership.group import Seat
from lakeprop.membership.topics import Claim

pytestmark = pytest.mark.integration

SLOTS = 6


@pytest.fixture
def seats(kafka: LocalKafka) -> Iterator[tuple[KafkaConfig, ExitStack]]:
    config = KafkaConfig(kafka.bootstrap_servers, topic=f"members-{uuid.uuid4().hex[:8]}")
    with ExitStack() as stack:
        yield config, stack


def cluster(protocol: str, instance: str) -> ClusterConfig:
    return ClusterConfig(
        enabled=True,
        instance_id=instance,
        slots=SLOTS,
        session_timeout=30.0,
        heartbeat_interval=1.0,
        group_protocol=protocol,
        static_membership=True,
    )


def seat(
    config: KafkaConfig,
    stack: ExitStack,
    protocol: str,
    instance: str,
    revoked: list[frozenset[int]] | None = None,
) -> Seat:
    def on_revoke(slots: frozenset[int]) -> None:
        if revoked is not None:
            revoked.append(slots)

    started = Seat(config, cluster(protocol, instance), on_revoke=on_revoke).start()
    stack.callback(started.stop)
    return started


def static_members(config: KafkaConfig, group: str) -> set[str | None]:
    """The instance ids of the group's members, as the coordinator lists them."""
    client = admin(config)
    described = client.describe_consumer_groups([group])[group].result(30)
    return {m.group_instance_id for m in described.members}


def shared(*seats: Seat) -> list[dict[int, Claim]]:
    """The seats' claims once they hold every slot between them, each some."""

    def check() -> list[dict[int, Claim]]:
        claims = [s.claims() for s in seats]
        assert all(claims) and sorted(s for c in claims for s in c) == list(range(SLOTS)), claims
        return claims

    result: list[dict[int, Claim]] = assert_eventually(check, timeout=90, interval=0.2)
    return result


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_static_member_restarted_within_its_session_timeout_moves_no_slot(
    seats: tuple[KafkaConfig, ExitStack], protocol: str
) -> None:
    config, stack = seats
    a = seat(config, stack, protocol, "a")
    revoked: list[frozenset[int]] = []
    b = seat(config, stack, protocol, "b", revoked)
    held_a, held_b = shared(a, b)
    revoked.clear()  # what the group did while the two joined

    a.stop()  # a rolling restart of a: its seat and slots wait for it
    assert "a" in static_members(config, a.group)
    again = seat(config, stack, protocol, "a")
    back, kept = shared(again, b)

    assert set(back) == set(held_a)
    assert all(back[s].epoch > held_a[s].epoch for s in back)  # claimed anew: fenced the old
    assert kept == held_b  # the same claims, the same epochs
    assert revoked == []  # b was not handed a's slots meanwhile


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_second_process_with_the_same_instance_id_leaves_one_holding_the_slots(
    seats: tuple[KafkaConfig, ExitStack], protocol: str
) -> None:
    config, stack = seats
    first = seat(config, stack, protocol, "a")
    (held,) = shared(first)
    second = seat(config, stack, protocol, "a")

    def one_holds_them() -> None:
        claims = [first.claims(), second.claims()]
        assert sorted(map(bool, claims)) == [False, True], claims

    assert_eventually(one_holds_them, timeout=90, interval=0.2)
    assert held
