"""A failed member's error code and message, on either path (Spark or native), and
the error of the members an iteration's failure kept from running."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.errors import AnalysisException

from lakeprop.engine.model import (
    CancelToken,
    IterationResult,
    MemberJob,
    MemberResult,
    source_gone,
)
from lakeprop.errors import ErrorCode, LakepropError
from lakeprop.tables.resolve import TableHandle


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


def fail_the_rest(
    result: IterationResult,
    jobs: Sequence[MemberJob],
    source: TableHandle,
    exc: Exception,
    token: CancelToken,
) -> None:
    """Members that did not run get the iteration's error: the source's, if the
    source went away (a permanent error that says so), else ``exc``'s."""
    code, message = member_error(exc, token)
    if not token.cancelled and not source.exists():
        code, message = int(ErrorCode.SOURCE_NOT_DELTA), source_gone(source)
    done = {m.job_id for m in result.members}
    result.members += [
        MemberResult(
            j.member.ref,
            j.member.job_id,
            j.spec.iteration.consumer.type,
            0,
            code,
            message,
            j.spec.iteration.consumer.canonical(),
        )
        for j in jobs
        if j.member.job_id not in done
    ]
