"""Waiting along a pipeline: a commit to a table reaching a job downstream of it.

A job downstream of table ``T`` reads the target of a job that reads the target
of ... a job that reads ``T``: a chain (each job has one source, each target one
writer, so there is one). Commit ``v`` of ``T`` has reached the chain's last job
once every job of the chain has consumed, of its source, the version the job
before it left while consuming the one before: the history records, for each
write to a table other jobs read, the version of it the write left
(``members.target_version``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lakeprop.client.reads import LATEST, StateReader
from lakeprop.client.scans import Condition, Query, eq
from lakeprop.client.views import JobInfo
from lakeprop.errors import InvalidArgumentError
from lakeprop.pipeline.graph import Node, Table, table_of
from lakeprop.spec import JobKey, JobSpec, target_table
from lakeprop.state.history import consumer_digest
from lakeprop.state.store import HISTORY_TABLE


class PipelineReader(StateReader):
    """:class:`StateReader` with the waits of a pipeline."""

    def wait_for_origin(
        self,
        key: JobKey,
        origin: tuple[str, str],
        version: int | str = LATEST,
        timeout: float = 300.0,
        progress: Callable[[str], None] | None = None,
    ) -> JobInfo:
        """Block until commit ``version`` of table ``origin`` (``(database, table)``)
        has reached the live job ``key``, which reads it directly or downstream of
        it; ``"latest"`` is the table's version when the call starts.

        Waits job by job along the chain (:meth:`wait_for_watermark` of each, in
        the version of its own source), all within ``timeout``. Returns the job
        ``key``. Raises :class:`InvalidArgumentError` when ``key`` is not
        downstream of ``origin``, and what :meth:`wait_for_watermark` raises.
        """
        deadline = time.monotonic() + timeout
        steps = self.chain_between(origin, key)
        first = steps[0]  # its names as registered, not as the caller spelled them
        at = self.source_version(first.database, first.table) if version == LATEST else version
        if not isinstance(at, int) or isinstance(at, bool) or at < 0:
            raise InvalidArgumentError(
                f"version must be a Delta version (>= 0) or {LATEST!r}, got {version!r}"
            )
        for step in steps:
            left = max(0.0, deadline - time.monotonic())
            job = self.wait_for_watermark(step, at, timeout=left, progress=progress)
            if step == key:
                return job
            at = self._version_left(job, at)
        raise AssertionError("unreachable: the chain ends at the job")

    def chain_between(self, origin: tuple[str, str], key: JobKey) -> list[JobKey]:
        """The live jobs from the one reading ``origin`` to ``key``, in order."""
        nodes = [Node.of_spec(job.key, job.spec) for job in self.list_jobs()]
        writer: dict[Table, Node] = {n.target: n for n in nodes if n.target is not None}
        node = next((n for n in nodes if n.key == key), None)
        if node is None:
            raise InvalidArgumentError(
                f"job {key} is not a live job (is it registered, and has the service applied it?)"
            )
        first, chain = table_of(*origin), [node]
        while chain[0].source != first:
            upstream = writer.get(chain[0].source)
            if upstream is None or upstream in chain:
                raise InvalidArgumentError(
                    f"job {key} is not downstream of {'.'.join(first)}: "
                    f"{'.'.join(chain[0].source)}, which {chain[0].key} reads, is written by "
                    + ("no job" if upstream is None else "a job of the chain itself")
                )
            chain.insert(0, upstream)
        return [n.key for n in chain]

    def _version_left(self, job: JobInfo, consumed: int) -> int:
        """The version of its target ``job`` left when it consumed source version
        ``consumed``: its current consumer's first successful write at or past it
        (a resync starts a new consumer: what an earlier one wrote does not count).
        A history without it (a release that did not record it) answers with the
        target's version now, which is at least that."""
        digest = consumer_digest(JobSpec.from_json(job.spec).iteration.consumer.canonical())
        where = (
            eq("database", job.key.database),
            eq("table", job.key.table),
            Condition("to_version", ">=", consumed),
            eq("job_id", job.job_id),
            eq("consumer_digest", digest),
            eq("error_code", 0),
        )
        columns = ("database", "table", "to_version", "ended_at", "members")
        runs = self._read(
            HISTORY_TABLE, Query(columns, where, ("to_version", "ended_at"), "members")
        )
        left = [r["target_version"] for r in runs if r.get("target_version") is not None]
        if left:
            return int(left[0])
        options = job.spec["iteration"]["consumer"].get("options") or {}
        return self.source_version(*target_table(job.key, options))
