"""Announce a writing application's commits, from a Spark ``QueryExecutionListener``.

    notifier = CommitNotifier(spark, client, [("sales", "orders"), ("sales", "lines")])
    notifier.install()
    ...  # writes to sales.orders: DataFrame writes, MERGE, UPDATE, DELETE, SQL
    notifier.uninstall()

Spark calls the listener after every query that succeeded (on its listener bus,
once the query and so its Delta commit are done). For each table it watches,
the notifier checks the Delta log for a commit past the version it last
announced (one file-system call, no Spark job) and announces the latest
version it finds (:meth:`LakepropClient.notify_commit`). Watching only the
tables the application writes keeps that to a few calls per query. The
listener is a Python object behind py4j, as ``foreachBatch`` functions are; a
failure inside it is logged and never reaches the application's query.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, ClassVar

from pyspark.sql import SparkSession

from lakeprop.client.api import LakepropClient
from lakeprop.errors import InvalidConfigError
from lakeprop.identifiers import validate_identifier
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import Tables

log = logging.getLogger(__name__)


class CommitNotifier:
    """A ``QueryExecutionListener`` that announces commits to the watched tables."""

    def __init__(
        self, spark: SparkSession, client: LakepropClient, tables: Iterable[tuple[str, str]]
    ) -> None:
        if client.tables is None:
            raise InvalidConfigError(
                "the notifier resolves tables as the service does: give the client "
                "tables=config.tables"
            )
        self.spark = spark
        self.client = client
        self.probe = DeltaLogProbe(spark)
        resolve = Tables(spark, client.tables)
        self.locations = {
            (validate_identifier(d, "database"), validate_identifier(t, "table")): (
                resolve.location(d, t)
            )
            for d, t in tables
        }
        self.announced: dict[tuple[str, str], int] = {}
        """The last version announced per table (-1: none yet)."""
        self.failures = 0
        self._lock = threading.Lock()
        self._listener: Any = None

    def install(self) -> CommitNotifier:
        """Register the listener with the session (and start py4j's callback server)."""
        from pyspark.java_gateway import ensure_callback_server_started

        gateway = self.spark.sparkContext._gateway
        assert gateway is not None
        ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
        for table, location in self.locations.items():
            latest = self.probe.latest_version(location)
            self.announced[table] = -1 if latest is None else latest
        self._listener = _Listener(self)
        self.spark._jsparkSession.listenerManager().register(self._listener)
        return self

    def uninstall(self) -> None:
        if self._listener is not None:
            self.spark._jsparkSession.listenerManager().unregister(self._listener)
            self._listener = None

    def check(self) -> list[tuple[str, str, int]]:
        """Announce every watched table with a commit past the last announced version."""
        sent = []
        with self._lock:  # listener calls may come from several threads
            for table, location in self.locations.items():
                last = self.announced[table]
                if not self.probe.has_version_after(location, last):
                    continue
                latest = self.probe.latest_version(location)
                if latest is None or latest <= last:
                    continue
                self.client.notify_commit(*table, latest)
                self.announced[table] = latest
                sent.append((*table, latest))
        return sent


class _Listener:
    """The py4j side: ``org.apache.spark.sql.util.QueryExecutionListener``."""

    def __init__(self, notifier: CommitNotifier) -> None:
        self.notifier = notifier

    def onSuccess(self, func_name: str, qe: Any, duration_ns: int) -> None:  # Java's name
        try:
            self.notifier.check()
        except Exception:  # never let a notice break the application's query
            self.notifier.failures += 1
            log.exception("could not announce a commit after %s", func_name)

    def onFailure(self, func_name: str, qe: Any, exception: Any) -> None:  # Java's name
        return None

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.sql.util.QueryExecutionListener"]
