"""A model of the cooperative-sticky assignor, for one subscription.

Kafka's ``cooperative-sticky`` assignor, when every member subscribes to the
same topic, gives a balanced assignment (members' partition counts differ by
at most one) that keeps as many of each member's previous partitions as that
allows; a partition that moves is first revoked from its old owner, then
assigned in a second rebalance. This model computes the same end state, so the
benchmarks can count what moves at a hundred instances without a hundred
processes; an integration test checks it against the real group coordinator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Assignment = dict[str, frozenset[int]]


def sticky(
    previous: Mapping[str, frozenset[int]], members: Sequence[str], slots: int
) -> Assignment:
    """The balanced assignment of ``slots`` to ``members`` that keeps most of ``previous``."""
    if not members:
        return {}
    base, extra = divmod(slots, len(members))
    kept = {m: sorted(s for s in previous.get(m, frozenset()) if s < slots) for m in members}
    # the members that held most keep the larger quotas: fewer slots move
    order = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    result = {m: kept[m][: quota[m]] for m in members}
    taken = {s for owned in result.values() for s in owned}
    free = [s for s in range(slots) if s not in taken]
    for m in order:
        need = quota[m] - len(result[m])
        result[m] += free[:need]
        free = free[need:]
    return {m: frozenset(owned) for m, owned in result.items()}


def owners(assignment: Mapping[str, frozenset[int]]) -> dict[int, str]:
    return {slot: member for member, owned in assignment.items() for slot in owned}


@dataclass(frozen=True)
class Movement:
    """What a membership change did to the tables' owners."""

    members_before: int
    members_after: int
    tables: int
    moved: int
    """Tables whose owner changed (those of a departed member included)."""
    fair_share: float
    """Tables per member after the change, if spread perfectly."""
    largest: int
    """Tables of the most loaded member after the change."""

    @property
    def moved_share(self) -> float:
        return self.moved / self.tables if self.tables else 0.0

    @property
    def imbalance(self) -> float:
        """The most loaded member's tables over the fair share (1.0: perfect)."""
        return self.largest / self.fair_share if self.fair_share else 0.0


def movement(
    before: Mapping[str, frozenset[int]],
    after: Mapping[str, frozenset[int]],
    tables_per_slot: Sequence[int],
) -> Movement:
    """Count the tables that changed owner between two assignments."""
    old, new = owners(before), owners(after)
    total = sum(tables_per_slot)
    moved = sum(n for slot, n in enumerate(tables_per_slot) if old.get(slot) != new.get(slot))
    loads = [sum(tables_per_slot[s] for s in owned) for owned in after.values()]
    return Movement(
        len(before),
        len(after),
        total,
        moved,
        total / len(after) if after else 0.0,
        max(loads, default=0),
    )
