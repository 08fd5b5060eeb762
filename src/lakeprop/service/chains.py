"""A pipeline's next steps, from the iterations that finished (step 1 of the runner).

A finished iteration whose member wrote a table other jobs read makes those jobs
due at once: their table is probed at the next tick, without waiting for a notice
or a sweep. Each downstream member also carries its origin, the commit to its
chain's first table its write reflects (:mod:`lakeprop.pipeline.freshness`), for
the end-to-end freshness in ``status`` and the event table.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from lakeprop.engine.model import IterationResult, MemberResult
from lakeprop.engine.selection import TriggerSelection
from lakeprop.notifications import CommitNotice
from lakeprop.pipeline.freshness import Origin, Origins, Written
from lakeprop.pipeline.graph import Table, table_of, target_of_consumer
from lakeprop.spec import target_table
from lakeprop.state.history import IterationHistory
from lakeprop.state.job_row import CatalogRow
from lakeprop.tables.resolve import Tables

log = logging.getLogger(__name__)


class Chains:
    """What the runner does for the jobs downstream of the iterations it records."""

    def __init__(
        self,
        selection: TriggerSelection,
        tables: Tables,
        rows: Callable[[], Iterable[CatalogRow]] = list,
        announce: Callable[[CommitNotice], None] | None = None,
        history: IterationHistory | None = None,
    ) -> None:
        self.selection = selection
        self.tables = tables
        self._history = history
        """Where the writes to pipeline tables before a restart were recorded."""
        self.origins = Origins(self._restore)
        """What each pipeline table's recent versions reflect."""
        self._rows = rows
        """Every job's catalog row, this instance's and the others'."""
        self._announce = announce
        """Where a write to a table other jobs read is announced (None: nowhere)."""

    def announce(self, results: Sequence[IterationResult]) -> None:
        """A commit notice for each target these iterations wrote that a live job
        reads, at the target's version now: with several instances the job may be
        served by another one, which starts it at once."""
        if self._announce is None:
            return
        written = [(m, _target(m)) for _, m in _written(results)]
        written = [(m, t) for m, t in written if t is not None]
        if not written:
            return
        read = {table for r in self._rows() if r.is_live for table in r.node.reads}
        for member, target in written:
            if target not in read:
                continue
            database, table = _target_name(member)
            version = member.wrote[0] if member.wrote else self._latest_version(database, table)
            if version is not None:  # else a hint lost: the reader's sweep covers it
                self._announce(CommitNotice(database, table, version))

    def follow(self, results: Sequence[IterationResult]) -> None:
        """Each downstream member's origin, and for each member whose target a live
        job reads (on any instance), the version it left and the origin that
        version reflects (before the history rows are written: they carry both)."""
        written = list(_written(results))
        if not written:
            return
        live = [r.node for r in self._rows() if r.is_live]
        read = {table for node in live for table in node.reads}
        written_by_jobs = {node.target for node in live}
        for result, member in written:
            key = member.ref[0]
            source, target = table_of(key.database, key.table), _target(member)
            version = result.plan.to_version
            if source in written_by_jobs:  # a downstream job: it read what a job wrote
                origin = member.origin = self.origins.upstream(source, version)
            elif target in read:  # a chain's first step: the commit it read up to
                at = self._commit_time(key.database, key.table, version)
                origin = None if at is None else Origin(source, at)
            else:
                continue
            if target is None or target not in read or origin is None:
                continue
            left = self._latest_version(*_target_name(member))
            if left is not None:
                member.wrote = (left, origin)
                self.origins.wrote(target, left, origin)

    def _restore(self, table: Table) -> list[Written]:
        """What the history recorded of the writes to ``table`` by the job writing it
        (a restarted service has seen none of them)."""
        if self._history is None:
            return []
        writer = next((r for r in self._rows() if r.is_live and r.node.target == table), None)
        if writer is None:
            return []
        try:
            writes = self._history.writes_of(
                writer.database, writer.table, writer.job_id, Origins.KEPT
            )
        except Exception as exc:  # freshness is a report: the next pass shows it
            log.warning("could not read the writes to %s.%s from the history: %s", *table, exc)
            return []
        return [
            (version, Origin(table_of(*name.split(".", 1)), at.timestamp()))
            for version, name, at in writes
        ]

    def feed_downstream(self, results: Sequence[IterationResult]) -> None:
        """Make the jobs that read what these iterations wrote due at the next tick
        (the scheduler's ``on_done`` has woken the query already): their tables
        are probed without waiting for a sweep. With notifications off every tick
        probes every table with a due job, so there is nothing to do."""
        dirty = self.selection.dirty
        if dirty is None:
            return
        watched = {table_of(*name): name for name in self.selection.watched}
        for _, member in _written(results):
            target = _target(member)
            if target in watched:
                dirty.touch(watched[target])

    def _latest_version(self, database: str, table: str) -> int | None:
        try:
            return self.tables.probe.latest_version(self.tables.location(database, table))
        except Exception as exc:
            log.debug("no version of %s.%s: %s", database, table, exc)
            return None

    def _commit_time(self, database: str, table: str, version: int) -> float | None:
        try:
            return self.tables.probe.commit_time(self.tables.location(database, table), version)
        except Exception as exc:
            log.debug("no commit time of %s.%s@%d: %s", database, table, version, exc)
            return None


def _written(results: Sequence[IterationResult]) -> Iterator[tuple[IterationResult, MemberResult]]:
    """The members that wrote their target, with their iteration."""
    for result in results:
        for member in result.members:
            if member.ok and member.consumer_spec:
                yield result, member


def _target_name(member: MemberResult) -> tuple[str, str]:
    """The (database, table) a member's consumer writes, as its options name it."""
    consumer = json.loads(member.consumer_spec)
    return target_table(member.ref[0], consumer.get("options") or {})


def _target(member: MemberResult) -> Table | None:
    """The table a member wrote that other jobs may read (None: not a table)."""
    consumer = json.loads(member.consumer_spec)
    return target_of_consumer(member.ref[0], consumer["type"], consumer.get("options") or {})
