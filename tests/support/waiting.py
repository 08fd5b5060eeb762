"""Waiting for a condition instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def assert_eventually(check: Callable[[], T], timeout: float = 30.0, interval: float = 0.5) -> T:
    """Retry ``check`` until it stops raising AssertionError or the timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(interval)
