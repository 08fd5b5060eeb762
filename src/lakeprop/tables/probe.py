"""Cheap change detection on Delta tables: file-system metadata, no Spark job.

A Delta table has a version after ``v`` exactly when its log holds the commit
file ``_delta_log/<v+1>.json``: one existence check per table per tick, and a
second one (``<v>.json``) to tell an idle table from one whose old commit files
log clean-up removed; only then is the checkpoint pointer read. The latest version
is found by listing the log, which happens only for tables that did change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pyspark.sql import SparkSession

from lakeprop.tables.hadoop import FilesFor, local_path

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")


@dataclass(frozen=True)
class LogMetadata:
    """A table's identity and columns, from the latest ``metaData`` action of its log."""

    table_id: str
    columns: tuple[str, ...]
    schema_json: str = ""
    """The table's schema as Delta stores it (Spark's JSON form of a ``StructType``)."""
    change_feed: bool = False
    """Whether its Change Data Feed is on (``delta.enableChangeDataFeed``)."""


@dataclass(frozen=True)
class CommitChanges:
    """What one commit changed, from its commit file."""

    rows: int
    """Its estimated Change Data Feed rows (:func:`estimate_change_rows`); a lower
    bound when not ``exact``."""
    metadata: bool
    """Whether it changed the table's metadata or protocol (a schema change among them)."""
    exact: bool = True
    """False when it removed files whose rows neither its metrics nor the files'
    statistics count (an overwrite's removed files carry no statistics): their rows
    are deletes of the change feed that ``rows`` leaves out."""
    vectored_removes: bool = False
    """It removed a file that carries a deletion vector (a delete that takes a file's
    last live rows): delta-rs 1.x reads the change rows of such a remove from the
    vector inverted, the rows deleted before instead of the ones deleted now."""


COUNTED = ("numTargetRowsInserted", "numUpdatedRows", "numDeletedRows")
"""Metrics by which an operation counts every row its change feed holds."""


def estimate_change_rows(
    metrics: Mapping[str, object], added_rows: int, removed_rows: int = 0
) -> int:
    """Change Data Feed rows a commit yields, from its ``operationMetrics``.

    An update yields a pre- and a post-image, an insert or a delete one row.
    Metrics are per operation: MERGE counts target rows inserted, updated and
    deleted; UPDATE and DELETE their rows; a write its output rows, to which an
    overwrite's removed rows add (``removed_rows``, from the removed files'
    statistics). Without any (metrics off, or an operation that records none:
    RESTORE, TRUNCATE), the rows of the files the commit added and removed.
    """

    def n(name: str) -> int:
        try:
            return int(str(metrics.get(name, 0)))
        except ValueError:
            return 0

    if "numTargetRowsInserted" in metrics:  # MERGE
        return (
            n("numTargetRowsInserted") + 2 * n("numTargetRowsUpdated") + n("numTargetRowsDeleted")
        )
    if "numUpdatedRows" in metrics:  # UPDATE
        return 2 * n("numUpdatedRows")
    if "numDeletedRows" in metrics:  # DELETE
        return n("numDeletedRows")
    if "numOutputRows" in metrics:  # WRITE, CREATE TABLE AS SELECT, STREAMING UPDATE
        return n("numOutputRows") + removed_rows
    return added_rows + removed_rows


MONOTONIC_LOOKBACK = 100
"""Commits before a range that Delta's change feed keeps its timestamps above."""


class DeltaLogProbe:
    """Reads Delta log metadata by location (local paths directly, others through Hadoop)."""

    def __init__(self, spark: SparkSession, remote_threads: int = 16) -> None:
        self.files_for = FilesFor(spark)
        self.remote_threads = remote_threads
        """Probes of tables off the local file system (object stores) run this many at
        once: there each existence check is a network round trip."""
        self._pool: ThreadPoolExecutor | None = None

    @staticmethod
    def _log(location: str, name: str | None = None) -> str:
        log = location.rstrip("/") + "/_delta_log"
        return log if name is None else f"{log}/{name}"

    @staticmethod
    def _commit(version: int) -> str:
        return f"{version:020d}.json"

    def _checkpoint_version(self, location: str) -> int | None:
        line = next(self.files_for(location).lines(self._log(location, "_last_checkpoint")), None)
        try:
            return int(json.loads(line)["version"]) if line else None
        except (ValueError, KeyError, TypeError):
            return None

    def has_version_after(self, location: str, version: int) -> bool:
        """True when the table has a commit later than ``version``."""
        return bool(self.changed_since(location, version))

    def changed_since(self, location: str, version: int) -> bool | None:
        """Whether the table has a commit later than ``version``; None when it no
        longer holds ``version`` (dropped, or replaced by a younger table).

        An idle table costs two existence checks and no read: commit files after
        the last checkpoint are contiguous, and log clean-up removes older ones
        oldest first, so when ``<version>.json`` is there and the next is not,
        ``version`` is the latest. Only when ``<version>.json`` is gone too is
        the checkpoint pointer read.
        """
        files = self.files_for(location)
        if files.exists(self._log(location, self._commit(version + 1))):
            return True
        if files.exists(self._log(location, self._commit(version))):
            return False
        checkpoint = self._checkpoint_version(location)
        if checkpoint is None or checkpoint < version:
            return None
        return checkpoint > version

    def changed_since_all(self, queries: Sequence[tuple[str, int]]) -> list[bool | None]:
        """:meth:`changed_since` of many (location, version) pairs, in order.

        Local tables are probed in this thread (microseconds each); the others
        on a pool of ``remote_threads``, so a tick over many object-store tables
        waits for about one round trip per ``remote_threads`` tables.
        """
        answers: list[bool | None] = [None] * len(queries)
        remote = [i for i, (location, _) in enumerate(queries) if local_path(location) is None]
        futures = {}
        if len(remote) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.remote_threads, "lakeprop-probe")
            futures = {i: self._pool.submit(self.changed_since, *queries[i]) for i in remote}
        for i, query in enumerate(queries):
            answers[i] = futures[i].result() if i in futures else self.changed_since(*query)
        return answers

    def table_id(self, location: str) -> str | None:
        """The table's identity from its first commit, or None when that file is gone
        (no table, or log clean-up removed it: ask Delta then)."""
        for line in self.files_for(location).lines(self._log(location, self._commit(0))):
            if '"metaData"' in line:
                metadata = json.loads(line).get("metaData") or {}
                return str(metadata["id"]) if "id" in metadata else None
        return None

    def metadata(self, location: str) -> LogMetadata | None:
        """Identity and columns of the table, from its JSON commits (no Spark job).

        The newest commit with a ``metaData`` action wins. None when the log has
        no JSON commit holding one after its last checkpoint (the metadata is in
        the checkpoint's Parquet: ask Delta then) or when there is no log.
        """
        files = self.files_for(location)
        names = files.names(self._log(location))
        commits = sorted(
            (int(m.group(1)) for m in map(_COMMIT.match, names) if m is not None), reverse=True
        )
        checkpoints = [int(m.group(1)) for m in map(_CHECKPOINT.match, names) if m is not None]
        floor = max(checkpoints, default=-1)
        for version in (v for v in commits if v > floor or (floor < 0 and v == 0)):
            for line in files.lines(self._log(location, self._commit(version))):
                if '"metaData"' in line:
                    meta = json.loads(line)["metaData"]
                    schema = json.loads(meta["schemaString"])
                    columns = tuple(str(f["name"]) for f in schema["fields"])
                    configuration = meta.get("configuration") or {}
                    change_feed = configuration.get("delta.enableChangeDataFeed") == "true"
                    return LogMetadata(str(meta["id"]), columns, meta["schemaString"], change_feed)
        return None

    def change_rows(self, location: str, version: int) -> int | None:
        """Estimated change rows of commit ``version`` (:func:`estimate_change_rows`),
        read from its commit file; None when that file is gone."""
        commit = self.commit_changes(location, version)
        return None if commit is None else commit.rows

    def commit_changes(self, location: str, version: int) -> CommitChanges | None:
        """What commit ``version`` changed: its estimated change rows, and whether it
        changed the table's metadata (schema, properties); None when its file is gone."""
        files = self.files_for(location)
        path = self._log(location, self._commit(version))
        if not files.exists(path):
            return None
        metrics: Mapping[str, object] = {}
        added = removed = 0
        uncounted = False
        metadata = False
        vectored = False
        for line in files.lines(path):
            if line.startswith('{"commitInfo"'):
                metrics = json.loads(line)["commitInfo"].get("operationMetrics") or {}
            elif line.startswith('{"add"'):
                add = json.loads(line)["add"]
                if add.get("dataChange", True) and add.get("stats"):
                    added += int(json.loads(add["stats"]).get("numRecords", 0))
            elif line.startswith('{"remove"'):
                remove = json.loads(line)["remove"]
                vectored = vectored or bool(remove.get("deletionVector"))
                if remove.get("dataChange", True):
                    stats = remove.get("stats")
                    if stats and "numRecords" in json.loads(stats):
                        removed += int(json.loads(stats)["numRecords"])
                    else:
                        uncounted = True
            elif line.startswith('{"metaData"') or line.startswith('{"protocol"'):
                metadata = True
        exact = not uncounted or any(name in metrics for name in COUNTED)
        return CommitChanges(
            estimate_change_rows(metrics, added, removed), metadata, exact, vectored
        )

    def metadata_changed(self, location: str, start: int, end: int) -> bool:
        """Whether a commit in ``(start, end]`` changed the table's metadata (its
        columns among it), or may have: a commit file of the range is gone."""
        files = self.files_for(location)
        for version in range(start + 1, end + 1):
            path = self._log(location, self._commit(version))
            if not files.exists(path):
                return True
            if any(line.startswith('{"metaData"') for line in files.lines(path)):
                return True
        return False

    def commit_time(self, location: str, version: int) -> float | None:
        """When commit ``version`` was made (its ``commitInfo`` timestamp, in epoch
        seconds); None when its file is gone or holds no commit info."""
        for line in self.files_for(location).lines(self._log(location, self._commit(version))):
            if line.startswith('{"commitInfo"'):
                timestamp = json.loads(line)["commitInfo"].get("timestamp")
                return None if timestamp is None else int(timestamp) / 1000.0
        return None

    def change_feed_times(self, location: str, first: int, last: int) -> dict[int, int] | None:
        """The ``_commit_timestamp`` Delta's change feed gives commits ``first`` to
        ``last``, in epoch milliseconds, by Delta's rule: the commit files'
        modification times, each kept above the one before it (from up to 100
        commits before ``first``, the ones still there), and a commit's in-commit
        timestamp instead where it has one. None when a commit file of the range is
        gone. (The ``commitInfo`` timestamp, which delta-rs gives, is taken before the
        file is written and differs.)"""
        files = self.files_for(location)
        times: dict[int, int] = {}
        previous: int | None = None
        for version in range(max(first - MONOTONIC_LOOKBACK, 0), last + 1):
            modified = files.modified(self._log(location, self._commit(version)))
            if modified is None:
                if version >= first:
                    return None
                continue
            moment = round(modified * 1000)
            if previous is not None and moment <= previous:
                moment = previous + 1
            previous = moment
            if version >= first:
                times[version] = moment
        for version in times:
            for line in files.lines(self._log(location, self._commit(version))):
                if line.startswith('{"commitInfo"'):
                    stamp = json.loads(line)["commitInfo"].get("inCommitTimestamp")
                    if stamp is not None:
                        times[version] = int(stamp)
                    break
        return times

    def latest_version(self, location: str) -> int | None:
        """The table's latest version, or None when it has no log (not a Delta table)."""
        names = self.files_for(location).names(self._log(location))
        versions = [
            int(match.group(1))
            for match in (_COMMIT.match(n) or _CHECKPOINT.match(n) for n in names)
            if match
        ]
        return max(versions, default=None)

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
        for version in range(latest, max(-1, latest - lookback), -1):
            path = self._log(location, self._commit(version))
            if not self.files_for(location).exists(path):
                return None
            for line in self.files_for(location).lines(path):
                if '"txn"' in line:
                    txn = json.loads(line).get("txn") or {}
                    if txn.get("appId") == app_id:
                        return int(txn["version"])
        return None
