"""py4j's traceback of a micro-batch refused while the query stops is dropped; others stay."""

from __future__ import annotations

import logging

import pytest

from lakeprop.service.runner import (
    PY4J_CALLBACK_LOGGER,
    RefusedBatchFilter,
    ServiceHaltedError,
    quiet_refused_batches,
)


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
