"""What a micro-batch did, told to whoever watches the runner (the metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lakeprop.engine.model import IterationResult
from lakeprop.engine.ownership import SlotChanges
from lakeprop.state.outcomes import Outcome, Verdict


@dataclass(frozen=True)
class BatchSummary:
    batch_id: int
    messages: int
    applied: int
    rejected: int
    unchanged: int

    @classmethod
    def of(cls, batch_id: int, messages: int, verdicts: Sequence[Verdict]) -> BatchSummary:
        def count(*outcomes: Outcome) -> int:
            return sum(v.outcome in outcomes for v in verdicts)

        return cls(
            batch_id=batch_id,
            messages=messages,
            applied=count(Outcome.APPLIED),
            rejected=count(Outcome.REJECTED),
            unchanged=count(Outcome.ALREADY_EXISTS, Outcome.NOT_FOUND),
        )

    def __str__(self) -> str:
        return (
            f"{self.messages} message(s), {self.applied} applied, {self.rejected} rejected, "
            f"{self.unchanged} unchanged"
        )


@dataclass
class BatchTimings:
    """Seconds one micro-batch spent in each phase."""

    batch_id: int
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:.3f}s" for k, v in self.phases.items())
        return f"{self.total:.3f}s ({parts})"


@dataclass(frozen=True)
class TickSummary:
    tables_probed: int
    tables_changed: int
    iterations: int
    fresh_jobs: int


class RunnerObserver(Protocol):
    """Told what each micro-batch did (the metrics implement it)."""

    def batch(self, timings: BatchTimings, tick: TickSummary | None) -> None: ...

    def results(self, results: Sequence[IterationResult]) -> None: ...

    def verdicts(self, verdicts: Sequence[Verdict], replayed: bool = False) -> None:
        """The verdicts this instance records (those of the slots it serves);
        ``replayed`` when they may have been told before (a micro-batch run again,
        a slot taken over from an instance that may have recorded them)."""

    def handover(self, handover: SlotChanges) -> None: ...

    def handing_over(self) -> None:
        """Slots are about to go to another instance: write out what is held."""


class Unobserved:
    """The observer when nobody watches."""

    def batch(self, timings: BatchTimings, tick: TickSummary | None) -> None:
        pass

    def results(self, results: Sequence[IterationResult]) -> None:
        pass

    def verdicts(self, verdicts: Sequence[Verdict], replayed: bool = False) -> None:
        pass

    def handover(self, handover: SlotChanges) -> None:
        pass

    def handing_over(self) -> None:
        pass


class Observers:
    """Several observers, each told everything in turn."""

    def __init__(self, *observers: RunnerObserver) -> None:
        self.observers = observers

    def batch(self, timings: BatchTimings, tick: TickSummary | None) -> None:
        for observer in self.observers:
            observer.batch(timings, tick)

    def results(self, results: Sequence[IterationResult]) -> None:
        for observer in self.observers:
            observer.results(results)

    def verdicts(self, verdicts: Sequence[Verdict], replayed: bool = False) -> None:
        for observer in self.observers:
            observer.verdicts(verdicts, replayed)

    def handover(self, handover: SlotChanges) -> None:
        for observer in self.observers:
            observer.handover(handover)

    def handing_over(self) -> None:
        for observer in self.observers:
            observer.handing_over()
