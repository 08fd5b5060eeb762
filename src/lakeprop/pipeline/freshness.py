"""A chain's end-to-end freshness: which commit to its first table each write reflects.

An iteration of a job that reads another job's target (a downstream job)
reflects the commit to the chain's first table that its upstream's last write
reflected, and so on up: its *origin*. The runner follows origins through the
chain as iterations finish (:class:`Origins`): a job whose source no job writes
starts one at the commit it read up to; a job whose target others read hands
its origin on. A downstream write's freshness is then the time from its
origin's commit to the write's end. Pure: the caller says when a commit was made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lakeprop.pipeline.graph import Table


@dataclass(frozen=True)
class Origin:
    """The commit to a chain's first table that a write reflects."""

    table: Table
    at: float
    """When that commit was made (epoch seconds)."""

    @property
    def name(self) -> str:
        return ".".join(self.table)


class Origins:
    """Per table a job wrote: the origin its last write reflects (held in memory;
    after a restart a chain's freshness shows once a pass has gone through it)."""

    def __init__(self) -> None:
        self._of: dict[Table, Origin] = {}

    def upstream(self, source: Table) -> Origin | None:
        """The origin of the last write to ``source`` by a job (None: no job wrote it
        since the start, or none writes it)."""
        return self._of.get(source)

    def of(self, source: Table, commit_time: Callable[[], float | None]) -> Origin | None:
        """What a write that read ``source`` reflects: its upstream's origin, or else
        the commit it read up to (``commit_time``), for a chain's first table."""
        found = self._of.get(source)
        if found is not None:
            return found
        at = commit_time()
        return None if at is None else Origin(source, at)

    def wrote(self, target: Table, origin: Origin) -> None:
        """A job wrote ``target`` reflecting ``origin`` (an older one never wins)."""
        current = self._of.get(target)
        if current is None or origin.at >= current.at:
            self._of[target] = origin

    def forget(self, table: Table) -> None:
        self._of.pop(table, None)
