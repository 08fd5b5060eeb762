"""Stopping the query between micro-batches, through py4j.

A ``foreachBatch`` callback runs on the query's own JVM thread, the one
``StreamingQuery.stop()`` interrupts. :class:`BatchGate` lets one micro-batch
at a time through and times its phases; while the service stops
(:meth:`BatchGate.halted`) a micro-batch that reaches the runner is refused
before it does anything: it waits in the JVM for the stop's interrupt
(:func:`await_stop_interrupt`) and fails with it (:func:`refusal`), so Spark
ends the query as stopped and a restart replays the batch. py4j's traceback of
such a refusal is dropped (:func:`quiet_refused_batches`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from lakeprop.engine.scheduler import SHUTTING_DOWN, Scheduler
from lakeprop.errors import TemporaryError
from lakeprop.service.observer import BatchTimings

log = logging.getLogger("lakeprop.service.runner")


class ServiceHaltedError(TemporaryError):
    """A micro-batch reached a runner that is stopping: it is replayed after a restart."""


REFUSAL_WAIT = 10.0
"""Seconds a refused micro-batch waits for ``StreamingQuery.stop()`` to interrupt it."""


def await_stop_interrupt(
    spark: SparkSession, timeout: float, stopped: Callable[[], bool]
) -> Py4JJavaError | None:
    """Sleep in the JVM until the query's ``stop()`` interrupts this callback, or
    ``timeout`` passes; the interrupt as Python sees it, or None.

    py4j runs the calls a ``foreachBatch`` callback makes on the JVM thread that
    called it (pinned thread mode, PySpark's default): the query's own thread,
    the one ``stop()`` interrupts. Python code waiting in Python would not see
    that interrupt, and ``stop()`` would wait for it. ``stop()`` may also have
    interrupted the thread before the batch reached this callback, and a step
    of the batch taken the interrupt; so once ``stopped`` says the stop has
    begun (the query no longer active), the thread interrupts itself.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    thread = jvm.java.lang.Thread
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if stopped():
                thread.currentThread().interrupt()
            thread.sleep(50)
    except Py4JJavaError as exc:
        if exc.java_exception.getClass().getName() == "java.lang.InterruptedException":
            return exc
        raise
    return None


def refusal(batch_id: int, interrupt: Py4JJavaError | None) -> ServiceHaltedError:
    """The error a refused micro-batch raises.

    With the stop's interrupt it names the interrupted py4j call the way Spark
    recognises one (``StreamExecution.isInterruptionException``): the query then
    ends as stopped, not failed, and the JVM logs no error. It is one line on
    purpose: Spark matches it with a regular expression whose recursion grows
    with the text that follows, and a Java stack trace overflows its stack.
    """
    message = f"micro-batch {batch_id} arrived while the query stops"
    if interrupt is None:  # no stop came: the query fails, and a restart replays the batch
        return ServiceHaltedError(message)
    called = interrupt.errmsg.strip()  # "An error occurred while calling z:....sleep."
    cause = interrupt.java_exception.toString()  # "java.lang.InterruptedException: ..."
    kind = f"{type(interrupt).__module__}.{type(interrupt).__name__}"
    return ServiceHaltedError(f"{message}: refused on {kind}: {called} {cause}")


PY4J_CALLBACK_LOGGER = "py4j.clientserver"
"""Where py4j logs, with its traceback at ERROR, whatever a ``foreachBatch`` callback raises."""


class RefusedBatchFilter(logging.Filter):
    """Drops py4j's traceback of a micro-batch refused while the query stops.

    Such a batch is expected on a stop (a tick arrives while the one in progress
    drains), has done nothing and is replayed after a restart; the runner logs
    one line for it. Every other exception of the callback keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, ServiceHaltedError)


def quiet_refused_batches() -> None:
    """Install :class:`RefusedBatchFilter` on py4j's callback logger, once."""
    logger = logging.getLogger(PY4J_CALLBACK_LOGGER)
    if not any(isinstance(f, RefusedBatchFilter) for f in logger.filters):
        logger.addFilter(RefusedBatchFilter())


Timed = Callable[[str], AbstractContextManager[None]]
"""Times one phase of a micro-batch: ``with timed("log"): ...``."""


class BatchGate:
    """One micro-batch at a time, none while the service stops, each one timed."""

    def __init__(self, spark: SparkSession, scheduler: Scheduler) -> None:
        self.spark = spark
        self.scheduler = scheduler
        self.timings: deque[BatchTimings] = deque(maxlen=10_000)
        """Phase timings of the latest micro-batches (benchmarks, metrics)."""
        self.batches = 0
        """Micro-batches processed (ticks), for waiting on the service without sleeping."""
        self.refusal_wait = REFUSAL_WAIT
        """Seconds a micro-batch refused while halted waits for the query's stop."""
        self._lock = threading.Lock()
        self._halted = False
        self._stopped: Callable[[], bool] = lambda: False

    @contextmanager
    def halted(self, timeout: float, stopped: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Cancel the iterations, wait (up to ``timeout``) for the micro-batch in
        progress, and refuse new ones.

        Yields whether it got in between micro-batches. Stopping the query inside
        this block does not interrupt a micro-batch half way (a Delta commit cut
        off by the interrupt). A batch that arrives meanwhile is refused before
        doing anything: it waits (up to :attr:`refusal_wait`) for the stop, which
        ``stopped`` reports, then fails, so its offsets are not committed and a
        restart replays it. Failed by the stop's interrupt, it ends the query as
        stopped; with no stop, the query fails. :meth:`resume` lets batches in
        again.
        """
        self._halted = True
        self._stopped = stopped
        # The micro-batch in progress may wait for cores that iterations hold.
        self.scheduler.cancel_all(SHUTTING_DOWN)
        between = self._lock.acquire(timeout=timeout)
        try:
            yield between
        finally:
            if between:
                self._lock.release()

    def resume(self) -> None:
        self._halted = False
        self._stopped = lambda: False

    @contextmanager
    def processing(self, batch_id: int) -> Iterator[Timed]:
        """Runs one micro-batch at a time (none while halted) and times its phases."""
        timings = BatchTimings(batch_id)

        @contextmanager
        def timed(phase: str) -> Iterator[None]:
            started = time.perf_counter()
            try:
                yield
            finally:
                timings.phases[phase] = time.perf_counter() - started

        # Never wait for the lock: a callback blocked in Python cannot be interrupted
        # by query.stop(), which would then wait for it forever (a refused batch
        # waits in the JVM instead). Micro-batches of one query never overlap, so
        # the lock is only ever taken by halted().
        if self._halted or not self._lock.acquire(blocking=False):
            log.info(
                "micro-batch %d arrived while the query stops: refused, a restart replays it",
                batch_id,
            )
            interrupt = await_stop_interrupt(self.spark, self.refusal_wait, self._stopped)
            raise refusal(batch_id, interrupt)
        try:
            yield timed
            self.batches += 1
        finally:
            self._lock.release()
            self.timings.append(timings)
            log.debug("batch %d: %s", batch_id, timings)
