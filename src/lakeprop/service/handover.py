"""The cluster hand-over: what the micro-batch thread does when slots move.

With ``cluster.enabled`` the membership seat's thread learns that slots are
revoked, lost or gained; at the start of the next micro-batch :meth:`Handover.run`
acts on it, the way a Kafka consumer's rebalance callbacks do:

* a **lost** slot (the coordinator gave it away without a revoke) has its
  iterations cancelled and is forgotten;
* a **revoked** slot is drained: its iterations are cancelled and waited for,
  what they did is recorded, the catalog is flushed, and then the slot is
  released;
* a **gained** slot is taken over: its jobs' rows are read as the tables hold
  them (rolled forward from the history) and its tables are served at once, so
  the same micro-batch's selection plans their first iterations. Then
  :meth:`Handover.seal`, after the selection and before this instance writes
  the catalog or the history, fences the writers that held the slot before on
  both, and records verdicts the previous owner did not.

An iteration planned before the fences is safe: the targets are fenced by the
job's own transaction ids, not by these, and what the iteration did is
recorded in a later micro-batch, after them. A previous owner's write that
lands between the reads and the fences is one the takeover did not see: the
first iteration applies its range again, which every consumer tolerates.

Between hand-overs the same object says what this instance may see and write:
the catalog rows of the tables it serves, the iteration results and verdicts
it records, and the signature its writes carry. With one instance every filter
passes everything and a hand-over never happens.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lakeprop.engine.model import IterationResult
from lakeprop.engine.ownership import SlotChanges, SoleOwner
from lakeprop.engine.scheduler import Scheduler
from lakeprop.engine.takeover import take_over
from lakeprop.membership.topics import Claim
from lakeprop.spec import JobRef
from lakeprop.state import shared as shared_state
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.history import IterationHistory, rolled_forward
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import OutcomeTables, Verdict

log = logging.getLogger(__name__)

DRAIN_WAIT = 60.0
"""Seconds a slot being given up waits for its cancelled iterations to end (the
rebalance waits for the drain; Kafka drops a member that keeps it past
``max.poll.interval.ms``, 300 s)."""
UNRECORDED_PER_SLOT = 10_000
"""Verdicts kept per slot served elsewhere (see :attr:`Handover.unrecorded`)."""


@dataclass(frozen=True)
class HandoverParts:
    """What a hand-over works with: the state tables it fences and reloads, the
    scheduler it cancels, and the runner's callbacks."""

    catalog: JobCatalog
    history: IterationHistory
    outcomes: OutcomeTables
    scheduler: Scheduler
    record_results: Callable[[], int]
    """Records the iterations that ended (the runner's step 1)."""
    forget: Callable[[Iterable[JobRef]], None]
    """Forgets what the runner keeps per job (retries) for jobs taken over."""
    fence: Callable[[str, list[shared_state.Signed]], None]
    """Fences writers on a state table (:func:`lakeprop.state.shared.fence`)."""
    drain_wait: float = DRAIN_WAIT
    told: Callable[[], None] = lambda: None
    """Writes out what the observers hold (the event table's verdicts) before a slot goes."""


@dataclass(frozen=True)
class Unsealed:
    """Slots taken over whose previous writers are not fenced yet (:meth:`Handover.seal`)."""

    slots: frozenset[int]
    fenced: list[shared_state.Signed]
    verdicts: list[Verdict]
    jobs: int
    began: float
    """When the take-over began (monotonic seconds)."""


class Handover:
    """Acts on slot changes and filters what this instance records (see the module)."""

    def __init__(self, ownership: SoleOwner, parts: HandoverParts) -> None:
        self.ownership = ownership
        self.parts = parts
        self.unrecorded: dict[int, deque[Verdict]] = {}
        """Per slot served elsewhere: verdicts of this instance's reading of the log,
        recorded if it takes the slot over before the owner did (bounded)."""
        self.unsealed: list[Unsealed] = []
        """Slots taken over in this micro-batch, for :meth:`seal`."""
        self._recorded: list[Verdict] = []
        """Verdicts :meth:`seal` recorded for the previous owners, until :meth:`recorded`."""

    # -- slot changes ---------------------------------------------------------------

    def run(self) -> SlotChanges | None:
        """Act on slot changes: drain the slots being revoked, forget lost ones, take
        over gained ones. Returns what changed (None: nothing)."""
        self.seal()  # a take-over whose micro-batch failed before its seal
        pending = self.ownership.pending()
        if not pending:
            return None
        if pending.lost:
            refs = self._refs_in(pending.lost)
            self.parts.scheduler.cancel(refs, "its table moved to another instance")
        if pending.revoking:
            self._drain(pending.revoking)
        if pending.gained:
            self._take_over(pending.gained)
        return pending

    def _refs_in(self, slots: frozenset[int] | set[int]) -> set[JobRef]:
        slot = self.ownership.slot
        return {
            ref
            for ref, row in self.parts.catalog.by_id().items()
            if slot(row.database, row.table) in slots
        }

    def _drain(self, slots: frozenset[int]) -> None:
        """Stop the iterations of ``slots``, record what they did, write their rows."""
        parts = self.parts
        refs = self._refs_in(slots)
        parts.scheduler.cancel(refs, "its table moves to another instance")
        ended = parts.scheduler.wait_ended(refs, parts.drain_wait)
        if not ended:
            log.warning(
                "iterations of slot(s) %s did not end: handing over, and the next owner "
                "fences this instance's writer",
                sorted(slots),
            )
        parts.record_results()
        parts.catalog.flush()
        parts.told()
        self.ownership.drained(slots, clean=ended)
        log.info("drained slot(s) %s: %d job(s) handed over", sorted(slots), len(refs))

    def _take_over(self, claims: Mapping[int, Claim]) -> None:
        """Take the claimed slots' jobs' rows as the tables hold them
        (:mod:`lakeprop.engine.takeover`), rolled forward from the history, and serve
        their tables; :meth:`seal` fences the writers that held them before."""
        ownership, parts = self.ownership, self.parts
        catalog, history = parts.catalog, parts.history
        began = time.monotonic()
        slots = set(claims)

        def ours(row: CatalogRow) -> bool:
            return ownership.slot(row.database, row.table) in slots

        # three reads of their own: the membership topic and two state tables
        with ThreadPoolExecutor(3, thread_name_prefix="lakeprop-takeover") as pool:
            writers = pool.submit(ownership.fenced, claims.values())
            durable_read = pool.submit(catalog.durable_rows, ours)
            reached_read = pool.submit(history.latest_success)
            fenced = [shared_state.Signed(f.app_id, f.version) for f in writers.result()]
            durable, reached = durable_read.result(), reached_read.result()
        decided = take_over([r for r in catalog.rows() if ours(r)], durable)
        durable_rows = [rolled_forward(r, reached) or r for r in decided.durable]
        ahead = [rolled_forward(r, reached) or r for r in decided.ahead]
        # rewrite them all under the new owner's stamp (status shows the owner)
        catalog.adopt(durable_rows, ahead, decided.gone)
        catalog.stage({r.row_id: r for r in durable_rows})
        parts.forget(r.row_id for r in (*durable_rows, *ahead))
        verdicts = [v for s in slots for v in self.unrecorded.pop(s, ())]
        ownership.serve(slots)
        self.unsealed.append(
            Unsealed(frozenset(slots), fenced, verdicts, len(durable_rows) + len(ahead), began)
        )

    def seal(self) -> None:
        """Fence the writers that held the slots taken over in this micro-batch on the
        history and the catalog, before this instance writes either (a micro-batch's
        catalog commit comes after this, its iterations' history rows in a later
        one), and record the verdicts they did not."""
        ownership, parts = self.ownership, self.parts
        paths = (parts.history.path, parts.catalog.path)
        while self.unsealed:
            taken = self.unsealed[0]
            if taken.fenced:
                with ThreadPoolExecutor(2, thread_name_prefix="lakeprop-fence") as pool:
                    list(pool.map(parts.fence, paths, [taken.fenced] * len(paths)))
            if taken.verdicts:
                parts.outcomes.record(taken.verdicts, -1)
                self._recorded += taken.verdicts
            ownership.adopt(taken.slots)
            self.unsealed.pop(0)
            log.info(
                "took over slot(s) %s: %d job(s), %d writer(s) fenced, in %.2fs",
                sorted(taken.slots),
                taken.jobs,
                len(taken.fenced),
                time.monotonic() - taken.began,
            )

    # -- what this instance sees and records ----------------------------------------

    def served(self, rows: Mapping[JobRef, CatalogRow]) -> Mapping[JobRef, CatalogRow]:
        """The rows of the tables this instance serves (all of them with one instance)."""
        if not self.ownership.clustered:
            return rows
        serves = self.ownership.serves
        tables = {(r.database, r.table) for r in rows.values()}
        served = {t for t in tables if serves(*t)}
        return {ref: r for ref, r in rows.items() if (r.database, r.table) in served}

    def writable(self, results: Sequence[IterationResult]) -> list[IterationResult]:
        """The results this instance may record: those of the tables it still owns.

        An iteration whose table moved away meanwhile is not recorded: its sink
        writes are idempotent and replay-tolerant, and the new owner starts from
        the last durable watermark.
        """
        kept = [
            r
            for r in results
            if self.ownership.may_write(r.plan.table.database, r.plan.table.table)
        ]
        if len(kept) < len(results):
            dropped = next(r for r in results if r not in kept)
            table = dropped.plan.table
            log.warning(
                "%d iteration result(s) not recorded: their tables moved to another instance "
                "(%s.%s %s)",
                len(results) - len(kept),
                table.database,
                table.table,
                self.ownership.explain(table.database, table.table),
            )
        return kept

    def recorded(self) -> list[Verdict]:
        """The verdicts recorded at take-overs since the last call (the previous owner
        may have told them too)."""
        recorded, self._recorded = self._recorded, []
        return recorded

    def ours(self, verdicts: list[Verdict]) -> list[Verdict]:
        """The verdicts this instance records: those of the tables it serves. The
        others' are kept a while, in case it takes their slot over first."""
        ownership = self.ownership
        if not ownership.clustered:
            return verdicts
        kept = []
        for verdict in verdicts:
            slot = (
                ownership.slot(verdict.key.database, verdict.key.table)
                if verdict.key is not None
                else verdict.record.partition % ownership.slots
            )
            if ownership.writes_slot(slot):
                kept.append(verdict)
            else:
                self.unrecorded.setdefault(slot, deque(maxlen=UNRECORDED_PER_SLOT)).append(verdict)
        return kept

    def signed(self) -> shared_state.Signed | None:
        """How this instance signs a write of the history (None: it writes alone)."""
        signature = self.ownership.sign()
        if signature is None:
            return None
        return shared_state.Signed(signature.app_id, signature.version, signature.owner)
