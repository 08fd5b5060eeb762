"""What an iteration cost Spark: its jobs, their task time, the bytes it cached.

Read from the driver's own status store (Spark's ``AppStatusListener``, the
SparkListener behind the web UI, which keeps each job's group and each stage's
executor run time) and from the block store's statistics of a checkpointed
DataFrame. PySpark exposes neither, so they go through the JVM; a Spark whose
internals differ yields None (the history column stays empty), never a wrong
figure or a failed iteration.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession

from lakeprop.changes.held import checkpointed_rdd

log = logging.getLogger(__name__)

LISTENER_WAIT_MS = 2000
"""How long to let the listener bus deliver the last task-end events."""


def group_jobs(spark: SparkSession, group: str) -> list[int]:
    """The Spark jobs launched in job group ``group`` (once the listener bus has
    delivered the last job starts, or :data:`LISTENER_WAIT_MS` has passed)."""
    _drain(spark)
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def _drain(spark: SparkSession) -> None:
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(LISTENER_WAIT_MS)
    except Exception:  # a busy bus, or a Spark without it: what the store has seen
        log.debug("listener bus not drained within %d ms", LISTENER_WAIT_MS)


def task_seconds(spark: SparkSession, jobs: list[int]) -> float | None:
    """Executor run time of every task of these jobs' stages, in seconds (summed
    over tasks, so two cores busy for one second count two). The jobs are those
    :func:`group_jobs` gave once they ended: the listener bus it drained then holds
    their tasks too, so it is not waited for again."""
    context = spark.sparkContext
    try:
        store = context._jsc.sc().statusStore()
        tracker = context.statusTracker()
        stages = {s for j in jobs if (info := tracker.getJobInfo(j)) for s in info.stageIds}
        total_ms = 0
        for stage in stages:
            try:
                total_ms += int(store.lastStageAttempt(stage).executorRunTime())
            except Exception:  # a stage skipped or no longer retained by the store
                continue
        return total_ms / 1000.0
    except Exception as exc:
        log.debug("task time unavailable: %s", exc)
        return None


def cached_bytes(spark: SparkSession, data: DataFrame) -> int | None:
    """Bytes the held ``data``, a locally checkpointed DataFrame, takes in Spark's
    block store, memory and disk; None when it is not one."""
    try:
        rdd = checkpointed_rdd(data)
        if rdd is None:
            return None
        infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
        return sum(int(i.memSize()) + int(i.diskSize()) for i in infos if i.id() == rdd.id())
    except Exception as exc:
        log.debug("cached bytes unavailable: %s", exc)
        return None
