"""Cheap change detection on Delta tables: file-system metadata, no Spark job.

A Delta table has a version after ``v`` exactly when its log holds the commit
file ``_delta_log/<v+1>.json``: one existence check per table per tick. Old
commit files are removed by log clean-up once a checkpoint covers them, so when
that file is missing the checkpoint pointer is consulted too. The latest version
is found by listing the log, which happens only for tables that did change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")


class DeltaLogProbe:
    """Reads Delta log metadata through the Hadoop file system of the session."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark.sparkContext._jvm
        self._conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
        self._fs: dict[str, Any] = {}

    def _log_path(self, location: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/_delta_log")

    def _filesystem(self, path: Any) -> Any:
        key = str(path.toUri().getScheme()) + "://" + str(path.toUri().getAuthority())
        if key not in self._fs:
            self._fs[key] = path.getFileSystem(self._conf)
        return self._fs[key]

    def _lines(self, log: Any, name: str) -> Iterator[str]:
        """The lines of a file in the log directory (none if it does not exist)."""
        fs = self._filesystem(log)
        path = self._jvm.org.apache.hadoop.fs.Path(log, name)
        if not fs.exists(path):
            return
        stream = fs.open(path)
        try:
            reader = self._jvm.java.io.BufferedReader(
                self._jvm.java.io.InputStreamReader(stream, "UTF-8")
            )
            line = reader.readLine()
            while line is not None:
                yield str(line)
                line = reader.readLine()
        finally:
            stream.close()

    def _checkpoint_version(self, log: Any) -> int | None:
        line = next(self._lines(log, "_last_checkpoint"), None)
        try:
            return int(json.loads(line)["version"]) if line else None
        except (ValueError, KeyError, TypeError):
            return None

    def has_version_after(self, location: str, version: int) -> bool:
        """True when the table has a commit later than ``version``."""
        log = self._log_path(location)
        fs = self._filesystem(log)
        if fs.exists(self._jvm.org.apache.hadoop.fs.Path(log, f"{version + 1:020d}.json")):
            return True
        checkpoint = self._checkpoint_version(log)
        return checkpoint is not None and checkpoint > version

    def has_version(self, location: str, version: int) -> bool:
        """True when the log still holds ``version`` (its commit file, or a later checkpoint).

        False means the table was dropped, or replaced by a younger one: a table
        never loses its latest commit file to log clean-up.
        """
        log = self._log_path(location)
        fs = self._filesystem(log)
        if fs.exists(self._jvm.org.apache.hadoop.fs.Path(log, f"{version:020d}.json")):
            return True
        checkpoint = self._checkpoint_version(log)
        return checkpoint is not None and checkpoint >= version

    def table_id(self, location: str) -> str | None:
        """The table's identity from its first commit, or None when that file is gone
        (no table, or log clean-up removed it: ask Delta then)."""
        for line in self._lines(self._log_path(location), f"{0:020d}.json"):
            if '"metaData"' in line:
                metadata = json.loads(line).get("metaData") or {}
                return str(metadata["id"]) if "id" in metadata else None
        return None

    def latest_version(self, location: str) -> int | None:
        """The table's latest version, or None when it has no log (not a Delta table)."""
        log = self._log_path(location)
        fs = self._filesystem(log)
        if not fs.exists(log):
            return None
        latest: int | None = None
        for status in fs.listStatus(log):
            name = status.getPath().getName()
            match = _COMMIT.match(name) or _CHECKPOINT.match(name)
            if match:
                version = int(match.group(1))
                latest = version if latest is None else max(latest, version)
        return latest

    def last_transaction(self, location: str, app_id: str, lookback: int = 100) -> int | None:
        """The last ``txnVersion`` committed to the table under ``app_id``, if any.

        Delta writes it in the same commit as the data (a ``txn`` action), so it
        says exactly which writes of that app already happened. Only recent commit
        files are read, newest first: the writer of ``app_id`` is normally the last
        one to commit.
        """
        latest = self.latest_version(location)
        if latest is None:
            return None
        log = self._log_path(location)
        fs = self._filesystem(log)
        for version in range(latest, max(-1, latest - lookback), -1):
            name = f"{version:020d}.json"
            if not fs.exists(self._jvm.org.apache.hadoop.fs.Path(log, name)):
                return None
            for line in self._lines(log, name):
                if '"txn"' in line:
                    txn = json.loads(line).get("txn") or {}
                    if txn.get("appId") == app_id:
                        return int(txn["version"])
        return None
