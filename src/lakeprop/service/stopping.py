"""Stopping the query between micro-batches, through py4j.

A ``foreachBatch`` callback runs on the query's own JVM thread, the one
``StreamingQuery.stop()`` interrupts. A micro-batch that reaches the runner
while it stops is refused before it does anything: it waits in the JVM for the
stop's interrupt (:func:`await_stop_interrupt`) and fails with it
(:func:`refusal`), so Spark ends the query as stopped and a restart replays the
batch. py4j's traceback of such a refusal is dropped (:func:`quiet_refused_batches`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from lakeprop.errors import TemporaryError


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
