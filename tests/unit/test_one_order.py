"""Every instance reaches the same verdict for every change-log message, whatever its
micro-batches held: the same messages applied in different batch splits, each
partition advancing on its own, give the same verdicts once every job message is on
the job partition (no Spark)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from lakeprop.changelog import JOB_PARTITION, Command, LogRecord, Operation
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey, JobRef, JobSpec
from lakeprop.state.apply import apply_commands
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Coordinates, Outcome, RecordedVerdict

T0 = datetime(2026, 12, 2, 12, 0, 0)
PARTITIONS = 3


def replica(**options: Any) -> JobSpec:
    return JobSpec.from_json(
        {
            "iteration": {
                "consumer": {"type": "replica", "options": {"primary_key": ["id"], **options}}
            }
        }
    )


X, Y = JobKey(0, "db", "x", "to_y"), JobKey(0, "db", "y", "to_x")  # x -> y and y -> x
EU, EU_X = JobKey(0, "db", "eu", "x_all"), JobKey(0, "db", "eu_x", "all")  # both eu_x_all
UP, READER = JobKey(0, "db", "src", "copy"), JobKey(0, "db", "src_copy", "next")

MESSAGES: list[tuple[Operation, JobKey, dict[str, Any]]] = [
    (Operation.REGISTER, X, {"spec": replica(target_table="y")}),
    (Operation.REGISTER, Y, {"spec": replica(target_table="x")}),  # a cycle, with X
    (Operation.REGISTER, EU, {"spec": replica()}),
    (Operation.REGISTER, EU_X, {"spec": replica()}),  # a second writer of db.eu_x_all
    (Operation.REGISTER, UP, {"spec": replica()}),
    (Operation.REGISTER, READER, {"spec": replica()}),  # reads UP's target
    (Operation.UNREGISTER, UP, {"cascade": False}),  # strands READER unless before it
    (Operation.PAUSE, READER, {}),
    (Operation.UNREGISTER, X, {"cascade": False}),
    (Operation.REGISTER, Y, {"spec": replica(target_table="x")}),  # fine once X is gone
]
"""Messages whose verdicts depend on the messages before them: the graph's."""


def keyed(n: int, key: JobKey) -> int:
    """The partition a message keyed by its job would land on (as before the job
    partition): any spread over the partitions will do."""
    return sum(map(ord, str(key))) % PARTITIONS


def on_the_job_partition(n: int, key: JobKey) -> int:
    return JOB_PARTITION


def produced(partition_of: Callable[[int, JobKey], int]) -> list[Command]:
    """The messages with the coordinates a broker gives them: offsets per partition."""
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    commands = []
    for n, (op, key, fields) in enumerate(MESSAGES):
        partition = partition_of(n, key)
        record = LogRecord(
            "log", partition, offsets[partition], T0 + timedelta(seconds=n), None, None
        )
        offsets[partition] += 1
        commands.append(Command(op, f"r{n}", key, record, **fields))
    return commands


def batches(commands: Sequence[Command], seed: int) -> list[list[Command]]:
    """Micro-batches as one instance's reads might split them: each batch advances
    every partition by its own random count, partitions fetched in a random order."""
    rng = random.Random(seed)
    queues = {p: [c for c in commands if c.record.partition == p] for p in range(PARTITIONS)}
    out: list[list[Command]] = []
    while any(queues.values()):
        batch: list[Command] = []
        for p in rng.sample(sorted(queues), len(queues)):
            take = rng.randint(0, len(queues[p]))
            batch += queues[p][:take]
            queues[p] = queues[p][take:]
        if batch:
            out.append(batch)
    return out


def check_ok(key: JobKey, spec: JobSpec) -> str:
    return f"id-of-{key.table}"


def verdicts_of(
    commands: Sequence[Command], seed: int, clustered: bool
) -> dict[Coordinates, tuple[Outcome, int | None]]:
    """One instance: every batch applied to the rows the batches before it left."""
    rows: dict[JobRef, CatalogRow] = {}
    seen: dict[Coordinates, tuple[Outcome, int | None]] = {}
    for batch in batches(commands, seed):
        result = apply_commands(rows.values(), batch, check_ok, one_partition=clustered)
        rows.update(result.upserts)
        for v in result.verdicts:
            seen[v.coordinates] = (v.outcome, v.error_code)
    return seen


SEEDS = range(40)


def test_on_the_job_partition_every_batch_split_reaches_the_same_verdicts() -> None:
    commands = produced(on_the_job_partition)
    first = verdicts_of(commands, 0, clustered=True)
    assert len(first) == len(MESSAGES)
    for seed in SEEDS:
        assert verdicts_of(commands, seed, clustered=True) == first, seed
    by_message = [first[(c.record.topic, c.record.partition, c.record.offset)] for c in commands]
    assert by_message == [
        (Outcome.APPLIED, ErrorCode.OK),
        (Outcome.REJECTED, ErrorCode.PIPELINE_CYCLE),
        (Outcome.APPLIED, ErrorCode.OK),
        (Outcome.REJECTED, ErrorCode.TARGET_TAKEN),
        (Outcome.APPLIED, ErrorCode.OK),
        (Outcome.APPLIED, ErrorCode.OK),
        (Outcome.REJECTED, ErrorCode.DOWNSTREAM_JOBS),
        (Outcome.APPLIED, ErrorCode.OK),
        (Outcome.APPLIED, ErrorCode.OK),
        (Outcome.APPLIED, ErrorCode.OK),
    ]


def test_spread_over_partitions_the_verdicts_depend_on_the_batches() -> None:
    """Why the job partition: keyed by job, the same messages reach different verdicts
    in different splits (a cycle of two jobs accepted by one instance and refused
    by another)."""
    commands = produced(keyed)
    assert len({c.record.partition for c in commands}) > 1
    outcomes = {tuple(sorted(verdicts_of(commands, seed, False).items())) for seed in SEEDS}
    assert len(outcomes) > 1


def test_a_clustered_service_rejects_job_messages_off_the_job_partition_alike() -> None:
    commands = produced(keyed)
    first = verdicts_of(commands, 0, clustered=True)
    for seed in SEEDS:
        assert verdicts_of(commands, seed, clustered=True) == first, seed
    off = [c for c in commands if c.record.partition != JOB_PARTITION]
    assert off and all(
        first[(c.record.topic, c.record.partition, c.record.offset)]
        == (Outcome.REJECTED, ErrorCode.OFF_THE_JOB_PARTITION)
        for c in off
    )


def test_a_message_applied_or_recorded_before_the_rule_keeps_its_verdict() -> None:
    """A replay of what a cluster applied before the rule: a message reflected in the
    rows, or one whose verdict is recorded, is not rejected now."""
    off = [c for c in produced(keyed) if c.record.partition != JOB_PARTITION]
    register = next(c for c in off if c.op is Operation.REGISTER)
    coordinates = (register.record.topic, register.record.partition, register.record.offset)
    before = apply_commands([], [register], check_ok)  # a single service applied it
    (applied,) = before.verdicts
    assert applied.outcome is Outcome.APPLIED
    replayed = apply_commands(before.upserts.values(), [register], check_ok, one_partition=True)
    assert replayed.verdicts == [] and replayed.upserts == {}  # in the rows: skipped
    recorded = {coordinates: RecordedVerdict(Outcome.APPLIED, applied.job_id, "id-of-x")}
    again = apply_commands([], [register], check_ok, recorded, one_partition=True)
    assert [v.outcome for v in again.verdicts] == [Outcome.APPLIED]
    (rejected,) = apply_commands([], [register], check_ok, one_partition=True).verdicts
    assert rejected.error_code == ErrorCode.OFF_THE_JOB_PARTITION
    assert f"partition {register.record.partition}" in rejected.detail
    assert "partition 0" in rejected.detail
