"""A failed member's error code and message, on either path (Spark or native)."""

from __future__ import annotations

from pyspark.errors import AnalysisException

from lakeprop.engine.model import CancelToken
from lakeprop.errors import ErrorCode, LakepropError


def member_error(exc: BaseException, token: CancelToken) -> tuple[int, str]:
    """A failed member's error code and message."""
    if token.cancelled:
        return int(token.code), token.reason
    if isinstance(exc, LakepropError):
        return exc.code, str(exc)
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, AnalysisException):
        # A query that does not resolve (a target altered underneath the job, a
        # column gone) fails the same way on every retry.
        return (
            int(ErrorCode.CONSUMER_FAILED),
            f"{first_line[:1000]} (a retry will not fix this: repair the target table, or "
            "update or re-register the job)",
        )
    return int(ErrorCode.CONSUMER_ERROR), f"{type(exc).__name__}: {first_line[:1000]}"
