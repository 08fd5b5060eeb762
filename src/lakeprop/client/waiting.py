"""Waiting on the service's state tables without sleeping blind: a wait re-reads a
table only after a new commit to it (:class:`TableWatch`), and tells a person how
long it has waited (:class:`Progress`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from lakeprop.client.scans import Scan
from lakeprop.errors import TemporaryError

T = TypeVar("T")


class TableWatch:
    """Tells whether a Delta table has a new commit since the last look, from its
    log alone (no Spark job): waits re-read a state table only then."""

    def __init__(self, scan: Scan, path: str) -> None:
        self.scan = scan
        self.path = path
        self.seen: int | None = None
        self.looked = False

    def changed(self) -> bool:
        version = self.scan.version(self.path)
        if self.looked and version == self.seen:
            return False
        self.seen, self.looked = version, True
        return True


class Progress:
    """Reports a long wait to a person: ``report`` hears the message, with the seconds
    waited, at most once per ``every`` seconds (the first time after ``every``)."""

    def __init__(
        self,
        report: Callable[[str], None] | None,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report = report
        self.every = every
        self.clock = clock
        self.started = clock()
        self._next = self.started + every

    def __call__(self, message: str) -> None:
        now = self.clock()
        if self.report is not None and now >= self._next:
            self.report(f"{message} ({now - self.started:.0f}s)")
            self._next = now + self.every


def poll_until(
    watches: Sequence[TableWatch],
    read: Callable[[], T],
    reached: Callable[[T], bool],
    where: Callable[[T], str],
    *,
    initial: T,
    timeout: float,
    poll: float,
    progress: Callable[[T], None] | None = None,
) -> T:
    """The one wait loop: re-``read`` when a watched table has a new commit, tell
    ``progress`` at every poll, and return once ``reached`` says so (it may raise,
    for a state no wait can leave). After ``timeout`` seconds, a temporary error
    says ``where`` the thing stands."""
    deadline = time.monotonic() + timeout
    value = initial
    while True:
        if any([w.changed() for w in watches]):
            value = read()
        if progress is not None:
            progress(value)
        if reached(value):
            return value
        if time.monotonic() >= deadline:
            raise TemporaryError(where(value))
        time.sleep(poll)
