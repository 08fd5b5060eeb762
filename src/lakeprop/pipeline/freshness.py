"""A chain's end-to-end freshness: which commit to its first table each write reflects.

An iteration of a job that reads another job's target (a downstream job)
reflects the commit to the chain's first table that its upstream's last write
reflected, and so on up: its *origin*. The runner follows origins through the
chain as iterations finish (:class:`Origins`): a job whose source no job writes
starts one at the commit it read up to; a job whose target others read hands
its origin on, per version of that target it left. A downstream write's
freshness is then the time from its origin's commit to the write's end. Pure:
the caller says when a commit was made and what the history recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


Written = tuple[int, Origin]
"""A version of a table a job wrote, and the origin that version reflects."""


class Origins:
    """Per table a job wrote: the origin each of its recent versions reflects.

    A downstream write is credited with the origin of the last version of its
    source it read (not the source's latest: its upstream may have written again
    while it ran). What a process has not seen itself (after a restart, or written
    by another instance) comes from ``restore``: the history's record of the writes.
    """

    KEPT = 64
    """Versions kept per table: the newest (a reader more than this far behind
    its upstream is credited with nothing rather than a wrong commit)."""

    def __init__(self, restore: Callable[[Table], Iterable[Written]] = lambda _t: ()) -> None:
        self._of: dict[Table, list[Written]] = {}
        self._restore = restore
        self._asked: dict[Table, int] = {}
        """Per table, the highest version ``restore`` was asked for."""

    def upstream(self, source: Table, version: int) -> Origin | None:
        """The origin that version ``version`` of ``source`` (a job's target)
        reflects: that of the last write at or before it (None: not known).

        What this process has not seen is asked of ``restore``: once per table (a
        restart), and again for a version newer than any asked for before and any
        write seen (another instance wrote it)."""
        kept = self._of.get(source, [])
        newest = max(kept[-1][0] if kept else -1, self._asked.get(source, -1))
        if source not in self._asked or version > newest:
            self._asked[source] = max(version, self._asked.get(source, -1))
            for written in self._restore(source):
                self.wrote(source, *written)
        found = [origin for at, origin in self._of.get(source, ()) if at <= version]
        return found[-1] if found else None

    def wrote(self, target: Table, version: int, origin: Origin) -> None:
        """A job's write left ``target`` at ``version``, reflecting ``origin``."""
        kept = self._of.setdefault(target, [])
        kept[:] = sorted(
            [w for w in kept if w[0] != version] + [(version, origin)], key=lambda w: w[0]
        )[-self.KEPT :]
