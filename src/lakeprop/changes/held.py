"""Rows held in Spark's block store by a local checkpoint: the RDD behind them,
and freeing their blocks as soon as their reader is done (not when the JVM's
garbage collector gets to them)."""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def checkpointed_rdd(data: DataFrame) -> Any | None:
    """The JVM RDD behind a locally checkpointed DataFrame (its plan is one
    ``LogicalRDD``), or None for any other DataFrame."""
    plan = data._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "LogicalRDD":
        return None
    return plan.rdd()


def release(data: DataFrame) -> None:
    """Free the blocks of a locally checkpointed (or persisted) DataFrame."""
    try:
        rdd = checkpointed_rdd(data)
    except Exception as exc:  # no JVM plan to look at: unpersist is all there is
        log.debug("checkpoint not found: %s", exc)
        rdd = None
    if rdd is None:
        data.unpersist()
    else:
        rdd.unpersist(False)
