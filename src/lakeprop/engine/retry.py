"""Retry with backoff (as TiDB's materialized views retry): 5 s, doubling, at most 5 min."""

from __future__ import annotations

BASE_DELAY = 5.0
MAX_DELAY = 300.0


def retry_delay(attempt: int, base: float = BASE_DELAY, cap: float = MAX_DELAY) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry)."""
    if attempt < 1:
        return 0.0
    return min(cap, base * 2.0 ** min(attempt - 1, 62))
