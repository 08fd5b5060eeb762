"""The runner: what happens in every micro-batch (``foreachBatch``).

In log order: decode the change log messages, record each one's verdict
(requests, rejects), then apply the valid ones to the job catalog. The verdicts
are written before the catalog so that a crash in between replays to the same
result: the catalog skips what it already holds and a replayed message keeps
the verdict recorded for it the first time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame

from lakeprop.catalog import JobCatalog, apply_commands
from lakeprop.changelog import Command, LogRecord, best_effort_request_id, decode
from lakeprop.errors import InvalidMessageError
from lakeprop.outcomes import Outcome, OutcomeTables, Verdict
from lakeprop.sources import SourceTables
from lakeprop.stream import log_records

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchSummary:
    batch_id: int
    messages: int
    applied: int
    rejected: int
    unchanged: int


def decode_all(records: Sequence[LogRecord], max_bytes: int) -> tuple[list[Command], list[Verdict]]:
    """Decode every record; invalid ones become rejected verdicts."""
    commands: list[Command] = []
    rejected: list[Verdict] = []
    for record in records:
        try:
            commands.append(decode(record, max_bytes))
        except InvalidMessageError as exc:
            rejected.append(
                Verdict(
                    record=record,
                    outcome=Outcome.REJECTED,
                    request_id=best_effort_request_id(record.value),
                    error_code=exc.code,
                    detail=str(exc),
                )
            )
    return commands, rejected


class Runner:
    """Applies the change log to the catalog, one micro-batch at a time."""

    def __init__(
        self,
        catalog: JobCatalog,
        outcomes: OutcomeTables,
        sources: SourceTables,
        max_message_bytes: int,
    ) -> None:
        self.catalog = catalog
        self.outcomes = outcomes
        self.sources = sources
        self.max_message_bytes = max_message_bytes
        self._busy = threading.Event()

    @property
    def busy(self) -> bool:
        """True while a micro-batch is being processed."""
        return self._busy.is_set()

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` callback."""
        self._busy.set()
        try:
            self.apply_log(log_records(batch), batch_id)
        finally:
            self._busy.clear()

    def apply_log(self, records: Sequence[LogRecord], batch_id: int) -> BatchSummary:
        if not records:
            return BatchSummary(batch_id, 0, 0, 0, 0)
        self.sources.forget()
        commands, verdicts = decode_all(records, self.max_message_bytes)
        result = apply_commands(
            self.catalog.rows(),
            commands,
            self.sources.check,
            self.outcomes.recorded(records),
        )
        verdicts += result.verdicts
        self.outcomes.record(verdicts, batch_id)
        self.catalog.commit(result.upserts)
        summary = BatchSummary(
            batch_id=batch_id,
            messages=len(records),
            applied=sum(v.outcome is Outcome.APPLIED for v in verdicts),
            rejected=sum(v.outcome is Outcome.REJECTED for v in verdicts),
            unchanged=sum(
                v.outcome in (Outcome.ALREADY_EXISTS, Outcome.NOT_FOUND) for v in verdicts
            ),
        )
        log.info(
            "batch %d: %d message(s), %d applied, %d rejected, %d unchanged",
            batch_id,
            summary.messages,
            summary.applied,
            summary.rejected,
            summary.unchanged,
        )
        for v in verdicts:
            if v.outcome is Outcome.REJECTED:
                log.warning("rejected %s: %s", v.record.coordinates, v.detail)
        return summary
