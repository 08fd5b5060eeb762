"""Membership: how many tables move when an instance joins or leaves, and balance.

The assignment is the model of Kafka's cooperative-sticky assignor in
`lakeprop.membership.assignment` (balanced slot counts, every slot kept where
that allows); `tables` tables named as users name them hash onto the slots with
`lakeprop.membership.slots.slot_of`. For each number of
instances and of slots: the share of the tables whose owner changes when one
instance joins and when one leaves (against the ideal 1/N), and the most
loaded instance's tables over a fair share. No Spark, no broker.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.common import Figure, Result
from lakeprop.membership.assignment import movement, sticky
from lakeprop.membership.slots import slot_of

TITLE = "membership"
LAYOUTS = ((10, 256), (100, 256), (100, 1024), (100, 4096))
"""(instances, slots) simulated."""


def run(
    spark: SparkSession, workdir: Path, bootstrap: str, tables: int = 100_000, **_: Any
) -> Result:
    result = Result(TITLE, {"tables": tables})
    rng = random.Random(7)
    names = [(f"db{rng.randrange(200)}", f"t{i}") for i in range(tables)]
    for instances, slots in LAYOUTS:
        per_slot = [0] * slots
        for database, table in names:
            per_slot[slot_of(database, table, slots)] += 1
        members = [f"i{n}" for n in range(instances)]
        before = sticky({}, members, slots)
        joined = movement(before, sticky(before, [*members, "new"], slots), per_slot)
        left = movement(before, sticky(before, members[1:], slots), per_slot)
        where = f"{instances} instances, {slots} slots"
        result.figures += [
            Figure(f"tables moved by a join, {where}", "ratio", round(joined.moved_share, 4)),
            Figure(f"tables moved by a leave, {where}", "ratio", round(left.moved_share, 4)),
            Figure(
                f"largest share over fair, {where}",
                "ratio",
                round(max(joined.imbalance, left.imbalance), 4),
            ),
        ]
        result.checks[f"moves at most 1/N + 10 %, {where}"] = all(
            m.moved_share <= 1 / m.members_after + 0.10 for m in (joined, left)
        )
    return result
