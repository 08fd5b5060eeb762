"""Fault points: parsing, counting hits, and doing nothing when off (no Spark)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lakeprop import faults
from lakeprop.errors import InvalidConfigError


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    faults.disarm()
    yield
    faults.disarm()


def test_parse() -> None:
    assert faults.parse("catalog.written=kill@3, gc.run=raise") == {
        "catalog.written": ("kill", 3),
        "gc.run": ("raise", 1),
    }
    assert faults.parse("") == {}


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("nowhere=kill", "unknown fault point"),
        ("gc.run", "unknown fault point"),
        ("gc.run=explode", "action"),
        ("gc.run=kill@0", "positive integer"),
        ("gc.run=kill@x", "positive integer"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, reason: str) -> None:
    with pytest.raises(InvalidConfigError, match=reason):
        faults.arm(spec)


def test_an_armed_point_fires_once_on_its_hit() -> None:
    faults.arm("iteration.before_write=raise@2,gc.run=raise@5")
    faults.fault_point("iteration.before_write")  # first hit: not yet
    faults.fault_point("batch.decoded")  # not armed
    assert faults.fired() == set()
    with pytest.raises(faults.InjectedFault, match=r"iteration\.before_write") as raised:
        faults.fault_point("iteration.before_write")
    assert raised.value.is_temporary
    faults.fault_point("iteration.before_write")  # fired already
    assert faults.fired() == {"iteration.before_write"}
    faults.disarm()
    assert faults.fired() == set()


def test_points_do_nothing_when_off() -> None:
    for point in faults.POINTS:
        faults.fault_point(point)


def test_armed_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "gc.run=raise")
    faults.arm_from_env()
    with pytest.raises(faults.InjectedFault):
        faults.fault_point("gc.run")
