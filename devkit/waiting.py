"""Waiting for a condition instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Changes(Protocol):
    """Something that says whether what a check reads has changed (a TableWatch)."""

    def changed(self) -> bool: ...


def assert_eventually(
    check: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.5,
    changes: Sequence[Changes] = (),
) -> T:
    """Retry ``check`` until it stops raising AssertionError or the timeout passes.

    With ``changes``, a failed check runs again only once one of them reports a
    change (a Delta table's new commit): a poll of a state table that nothing
    wrote since costs no Spark job, and leaves the cores to the service.
    """
    deadline = time.monotonic() + timeout
    last: AssertionError | None = None
    while True:
        if last is None or not changes or any([c.changed() for c in changes]):
            try:
                return check()
            except AssertionError as exc:
                last = exc
        if time.monotonic() >= deadline:
            raise last
        time.sleep(interval)
