"""Fan-out: each member of an iteration gets the change set, in turn or on threads
of their own, each with a session of its own.

The per-member step (:func:`run_member`) is the same on both paths: build the
member's consumer from its context, call it, and turn what it raises into the
member's error; the Spark path (:mod:`.iteration`) and the native one
(:mod:`.native`) differ only in the context and in the call.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark import InheritableThread
from pyspark.sql import SparkSession

from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.engine.failures import member_error
from lakeprop.engine.model import CancelToken, IterationResult, MemberJob, MemberResult
from lakeprop.faults import fault_point
from lakeprop.registry import get_consumer_type
from lakeprop.tables.resolve import Tables

log = logging.getLogger("lakeprop.engine.iteration")

Consume = Callable[[SparkSession, MemberJob], MemberResult]
"""One member's step, on the session it is given."""


def member_context(
    spark: SparkSession, job: MemberJob, tables: Tables, token: CancelToken | None, **path: Any
) -> ConsumerContext:
    """The context of one member's consumer; ``path`` adds what the path knows (the
    change set's columns and size, its key bounds, the held last changes, the
    storage options of delta-rs)."""
    consumer = job.spec.iteration.consumer
    return ConsumerContext(
        spark=spark,
        key=job.key,
        job_id=job.member.job_id,
        consumer_type=consumer.type,
        options=consumer.options,
        generation=consumer.generation,
        locate=lambda database, table: tables.handle(database, table, spark),
        cancelled=(lambda: token.cancelled) if token is not None else (lambda: False),
        joined_from=job.joined_from,
        **path,
    )


def run_member(
    job: MemberJob,
    context: ConsumerContext,
    token: CancelToken,
    call: Callable[[Consumer], int],
    where: str,
) -> MemberResult:
    """One member's step: its consumer built from ``context`` and ``call``ed, which
    returns the rows written; what it raises is the member's error."""
    info = job.spec.iteration.consumer
    result = MemberResult(
        job.member.ref, job.member.job_id, info.type, consumer_spec=info.canonical()
    )
    if token.cancelled:
        result.error_code, result.error_msg = int(token.code), token.reason
        return result
    try:
        result.rows_written = call(get_consumer_type(info.type).factory(context))
        if context.joined:
            result.joined = dict(context.joined)
    except Exception as exc:
        result.error_code, result.error_msg = member_error(exc, token)
        log.warning(
            "job %s (%s) failed in %s: [%s] %s",
            job.key,
            info.type,
            where,
            result.error_code,
            result.error_msg,
        )
    return result


def fan_out(
    spark: SparkSession,
    jobs: Sequence[MemberJob],
    consume: Consume,
    result: IterationResult,
    threads: int,
    confs: Mapping[str, str],
    after_first: Callable[[], None] = lambda: None,
) -> None:
    """Every member's step: on up to ``threads`` threads, each with a session of its
    own, or in turn on ``spark``; results in member order. ``after_first`` runs
    once the first member has written."""
    if threads > 1 and len(jobs) > 1:
        _concurrently(spark, jobs, consume, result.members, threads, confs)
        return
    with session_confs(spark, confs):
        for i, job in enumerate(jobs):
            if i:
                fault_point("iteration.between_consumers")
            result.members.append(consume(spark, job))
            if i == 0:
                after_first()


def _concurrently(
    spark: SparkSession,
    jobs: Sequence[MemberJob],
    consume: Consume,
    members: list[MemberResult],
    threads: int,
    confs: Mapping[str, str],
) -> None:
    """Members on up to ``threads`` threads; their results go to ``members`` in
    member order, those done even when the fan-out fails. The
    ``iteration.between_consumers`` point fires once the first member has
    written while another has not finished."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(jobs)):
        todo.put(i)
    finished: queue.Queue[int] = queue.Queue()
    done: dict[int, MemberResult] = {}

    def work(session: SparkSession) -> None:
        with session_confs(session, confs):
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    done[i] = consume(session, jobs[i])
                finally:
                    finished.put(i)

    workers = [
        InheritableThread(target=work, args=(session,), name=f"lakeprop-consumer-{n}", daemon=True)
        for n, session in enumerate(consumer_sessions(spark, min(threads, len(jobs))))
    ]
    for worker in workers:
        worker.start()
    try:
        finished.get()
        fault_point("iteration.between_consumers")
    finally:
        for worker in workers:
            worker.join()
        members += [done[i] for i in sorted(done)]


def small_confs(spark: SparkSession) -> dict[str, str]:
    """Session confs for consumers of a small change set: no adaptive execution
    (each shuffle stage of a MERGE would be a Spark job of its own), and as many
    shuffle partitions as the cluster has cores by default, not 200."""
    return {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": str(max(1, spark.sparkContext.defaultParallelism)),
    }


@contextmanager
def session_confs(session: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """``confs`` set on ``session`` (a worker's or a consumer's own) for the block,
    then each back to what it was."""
    before: dict[str, str | None] = {key: session.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key, earlier in before.items():
            if earlier is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, earlier)


_SESSIONS: weakref.WeakKeyDictionary[SparkSession, list[SparkSession]] = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def consumer_sessions(spark: SparkSession, count: int) -> list[SparkSession]:
    """``count`` sessions of the worker session ``spark``'s own, made once and reused."""
    with _SESSIONS_LOCK:
        sessions = _SESSIONS.setdefault(spark, [])
        while len(sessions) < count:
            sessions.append(spark.newSession())
        return sessions[:count]
