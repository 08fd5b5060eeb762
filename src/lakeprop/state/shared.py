"""Writing state tables that several service instances share (``cluster.enabled``).

Each write is signed (:class:`Signed`): a Delta transaction app id and version,
which make Delta skip the write once a newer owner has fenced the writer, and
an owner stamp for the rows. Concurrent writes of other instances to the same
table make Delta refuse a commit with a concurrent-modification conflict; the
write is retried a bounded number of times, then fails with a clear error.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from pyspark.sql import SparkSession

from lakeprop.errors import StateConflictError

log = logging.getLogger(__name__)

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
ATTEMPTS = 8
"""Tries of one write before its conflicts fail the micro-batch."""

T = TypeVar("T")


@dataclass(frozen=True)
class Signed:
    """A write's Delta transaction id and the owner stamp of its rows."""

    app_id: str
    version: int
    owner: str = ""

    def writer_options(self) -> dict[str, str]:
        return {"txnAppId": self.app_id, "txnVersion": str(self.version)}


CONFLICTS = (
    "ConcurrentAppend",
    "ConcurrentDeleteRead",
    "ConcurrentDeleteDelete",
    "ConcurrentTransaction",
    "ConcurrentWrite",
    "MetadataChanged",
    "ProtocolChanged",
    "DELTA_CONCURRENT",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)
"""How Delta names its refusals of a commit that raced another one (class names and
error classes), as py4j and PySpark's captured exceptions show them."""


def conflicting(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta's refusal of a commit that raced another one."""
    from delta.exceptions import DeltaConcurrentModificationException

    if isinstance(exc, DeltaConcurrentModificationException):
        return True
    text = f"{type(exc).__name__}: {exc}"
    return any(name in text for name in CONFLICTS)


_conflicts: Counter[str] = Counter()
_conflicts_lock = threading.Lock()


def conflicts_seen() -> dict[str, int]:
    """Conflicts with other instances' writes so far in this process, per state table
    (each one a write done again)."""
    with _conflicts_lock:
        return dict(_conflicts)


def with_retries(
    what: str, write: Callable[[], T], attempts: int = ATTEMPTS, table: str = "other"
) -> T:
    """Run ``write``, again after a conflict, at most ``attempts`` times; each conflict
    counts for ``table`` (:func:`conflicts_seen`)."""
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except Exception as exc:
            if not conflicting(exc):
                raise
            with _conflicts_lock:
                _conflicts[table] += 1
            if attempt == attempts:
                raise StateConflictError(
                    f"{what} conflicted with other instances' writes {attempts} times in a row; "
                    f"last conflict: {str(exc).splitlines()[0][:300]}"
                ) from None
            delay = min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())
            log.info("%s conflicted with another instance's write; again in %.2fs", what, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


@contextmanager
def signed_session(spark: SparkSession, signed: Signed | None) -> Iterator[None]:
    """Make the MERGE/UPDATE/DELETE inside carry ``signed``'s transaction id.

    The confs are per session: give each writing thread a session of its own.
    """
    if signed is None:
        yield
        return
    spark.conf.set(TXN_APP_ID, signed.app_id)
    spark.conf.set(TXN_VERSION, str(signed.version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


def fence(spark: SparkSession, path: str, fenced: list[Signed]) -> None:
    """Commit each fenced writer's transaction id at its fence version to ``path``
    (an empty append per writer): Delta skips that writer's later writes there."""
    if not fenced:
        return
    frame = spark.createDataFrame([], spark.read.format("delta").load(path).schema)
    for signed in fenced:
        writer = frame.write.format("delta").mode("append").options(**signed.writer_options())
        with_retries(
            f"fencing writer {signed.app_id} on {path}", partial(writer.save, path), table="fence"
        )
