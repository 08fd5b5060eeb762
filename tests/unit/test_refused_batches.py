"""py4j's traceback of a micro-batch refused while the query stops is dropped; others stay."""

from __future__ import annotations

import logging
import re
import traceback

import pytest
from py4j.protocol import Py4JJavaError

from lakeprop.service.stopping import (
    PY4J_CALLBACK_LOGGER,
    RefusedBatchFilter,
    ServiceHaltedError,
    quiet_refused_batches,
    refusal,
)

SPARK_INTERRUPTED_PROXY_CALL = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException"
    r"|java.nio.channels.ClosedByInterruptException)"
)
"""``StreamExecution.PROXY_ERROR`` of Spark 4.0: a foreachBatch error that matches it,
raised while the query stops, ends the query as stopped."""


class JavaInterrupt:
    """The JVM side of an interrupted ``Thread.sleep``, as py4j hands it to Python."""

    _target_id = "o42"

    def toString(self) -> str:  # the Java method
        return "java.lang.InterruptedException: sleep interrupted"


def callback_failure(error: BaseException) -> None:
    """What py4j does with an exception of a Python callback: log it with its traceback."""
    try:
        raise error
    except BaseException:
        logging.getLogger(PY4J_CALLBACK_LOGGER).exception("exception in the Python proxy")


def test_only_a_refused_batch_loses_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    quiet_refused_batches()
    quiet_refused_batches()  # installed once, however often a runner is built
    filters = logging.getLogger(PY4J_CALLBACK_LOGGER).filters
    assert [type(f) for f in filters].count(RefusedBatchFilter) == 1

    callback_failure(ServiceHaltedError("micro-batch 7 arrived while the query stops"))
    callback_failure(RuntimeError("a real failure of the callback"))
    logging.getLogger(PY4J_CALLBACK_LOGGER).error("no exception at all")

    assert [
        (r.levelno, r.getMessage(), r.exc_info and type(r.exc_info[1])) for r in caplog.records
    ] == [
        (logging.ERROR, "exception in the Python proxy", RuntimeError),
        (logging.ERROR, "no exception at all", None),
    ]


def raised_text(error: BaseException) -> str:
    """What py4j sends the JVM for an exception of a callback: its traceback."""
    try:
        raise error
    except BaseException:
        return traceback.format_exc()


def test_a_refusal_interrupted_by_the_stop_reads_as_an_interrupt_to_spark_in_one_line() -> None:
    interrupt = Py4JJavaError(
        "An error occurred while calling z:java.lang.Thread.sleep.\n", JavaInterrupt()
    )
    error = refusal(7, interrupt)
    assert str(error) == (
        "micro-batch 7 arrived while the query stops: refused on py4j.protocol.Py4JJavaError: "
        "An error occurred while calling z:java.lang.Thread.sleep. "
        "java.lang.InterruptedException: sleep interrupted"
    )
    match = SPARK_INTERRUPTED_PROXY_CALL.search(raised_text(error))
    assert match is not None
    # Spark's pattern recurses once per character after its prefix: the text stays short
    assert len(raised_text(error)) - match.start() < 300


def test_a_refusal_no_stop_interrupted_fails_the_query() -> None:
    error = refusal(7, None)
    assert str(error) == "micro-batch 7 arrived while the query stops"
    assert SPARK_INTERRUPTED_PROXY_CALL.search(raised_text(error)) is None
