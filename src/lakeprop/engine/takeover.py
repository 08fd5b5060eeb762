"""Taking over a slot's jobs: what the table says against what memory knows (pure).

Every instance applies the whole change log to its memory, but only a table's
owner writes its rows. A new owner therefore holds two views of each job of a
slot it takes over: the row the previous owner last wrote, and the row its own
reading of the log produced. Whichever applied the later change log message
wins (messages of one job share a log partition, so their offsets compare):

* the table is level or ahead: take its row (its watermark, state and
  status are the previous owner's progress);
* memory is ahead (the previous owner had not read the latest messages yet):
  keep memory's row and write it, with the table's watermark unless the newer
  messages restarted the job (a new consumer or a resync);
* a job only memory knows is a registration nobody wrote: write it, unless it
  was dropped too (then there is nothing to write).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from lakeprop.spec import JobRef
from lakeprop.state.job_row import CatalogRow


@dataclass
class TakeOver:
    durable: list[CatalogRow] = field(default_factory=list)
    """Rows to take as the table holds them."""
    ahead: list[CatalogRow] = field(default_factory=list)
    """Rows memory knows better: to be written by the new owner."""
    gone: list[JobRef] = field(default_factory=list)
    """Rows to forget: dropped jobs the table no longer holds."""


def _later(mine: CatalogRow, theirs: CatalogRow) -> bool:
    """Whether ``mine`` reflects a later change log message than ``theirs``."""
    return mine.log_partition == theirs.log_partition and mine.log_offset > theirs.log_offset


def take_over(memory: Iterable[CatalogRow], durable: Iterable[CatalogRow]) -> TakeOver:
    """Decide, per job of the slots taken over, which view of it to keep."""
    known = {r.row_id: r for r in memory}
    result = TakeOver()
    for theirs in durable:
        mine = known.pop(theirs.row_id, None)
        if mine is None or not _later(mine, theirs):
            result.durable.append(theirs)
        elif mine.consumer_spec() == theirs.consumer_spec():
            result.ahead.append(
                replace(mine, watermark=theirs.watermark, watermark_ts=theirs.watermark_ts)
            )
        else:
            result.ahead.append(mine)
    for mine in known.values():
        if mine.is_live:
            result.ahead.append(mine)
        else:
            result.gone.append(mine.row_id)
    return result
