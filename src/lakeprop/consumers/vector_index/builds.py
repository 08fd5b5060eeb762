"""Index versions built in the background while tails go on against the live one.

One build per job configuration (its Delta transaction app id) at a time, on a
daemon thread of the service process: a crash or a shutdown loses it, and the
next iteration that finds the index drifted starts it again (the rows it had
written are replaced, never doubled). A thread that outlives its process's
ownership of the job runs on; the owner's switch fences it. The tail iteration
that finds a build finished fences its version (:func:`fence`), makes it equal
to the live one (:func:`reconcile`) and switches the pointer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.vector_index import ivf
from lakeprop.consumers.vector_index.options import VectorOptions
from lakeprop.consumers.vector_index.versions import (
    CENTROIDS,
    IndexTables,
    IndexVersion,
    replacing,
    shape,
)
from lakeprop.faults import fault_point
from lakeprop.tables.probe import DeltaLogProbe

log = logging.getLogger("lakeprop.vector_index")

SAMPLE_PER_LIST = 128
MAX_SAMPLE = 200_000


@dataclass
class Build:
    """A new index version being written from the postings as of ``read_at``."""

    number: int
    """The index version it writes."""
    read_at: int
    """The postings table's Delta version it reads."""
    because: str
    result: Any = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.finished.is_set()


class Builds:
    """The builds running or finished in this process, by transaction app id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._builds: dict[str, Build] = {}

    def get(self, app_id: str) -> Build | None:
        with self._lock:
            return self._builds.get(app_id)

    def start(self, app_id: str, build: Build, work: Callable[[], Any]) -> Build:
        """Run ``work`` on a daemon thread; its result or error lands on ``build``."""

        def run() -> None:
            try:
                build.result = work()
            except BaseException as exc:  # reported to the next iteration
                log.warning("building index version %s of %s failed: %s", build.number, app_id, exc)
                build.error = exc
            finally:
                build.finished.set()

        with self._lock:
            self._builds[app_id] = build
        threading.Thread(target=run, name=f"index-build-{app_id}", daemon=True).start()
        return build

    def forget(self, app_id: str) -> None:
        with self._lock:
            self._builds.pop(app_id, None)

    def wait(self, prefix: str = "", timeout: float | None = None) -> bool:
        """Wait for the builds whose app id starts with ``prefix``; False on timeout."""
        with self._lock:
            running = [b for k, b in self._builds.items() if k.startswith(prefix)]
        return all(b.finished.wait(timeout) for b in running)


BUILDS = Builds()
"""This process's builds."""


class IndexWriter(Protocol):
    """What a build needs of the consumer: its tables, and how it assigns vectors to
    lists and MERGEs them (:class:`~.consumer.VectorIndexConsumer`)."""

    context: ConsumerContext
    options: VectorOptions
    tables: IndexTables

    def assigned(self, rows: DataFrame, centroids: ivf.Vectors, dimension: int) -> DataFrame: ...

    def merge(
        self,
        source: DataFrame,
        index: IndexVersion,
        at: int,
        app_id: str | None = None,
    ) -> None: ...

    def on_session(self, session: SparkSession) -> IndexWriter: ...


def build_app_id(writer: IndexWriter, number: int) -> str:
    """The Delta transaction app id of background builds of index version ``number``;
    its versions are postings table versions."""
    return f"{writer.context.txn_app_id}-v{number}"


def start(writer: IndexWriter, live: IndexVersion, dimension: int, because: str) -> None:
    """Build the version after ``live`` from the live postings as they are now, on a
    thread of its own: tails go on against the live version meanwhile."""
    number = live.index_version + 1
    context = writer.context
    postings = writer.tables.postings
    read_at = DeltaLogProbe(context.spark).latest_version(postings.location())
    assert read_at is not None
    txn = {"txnAppId": build_app_id(writer, number), "txnVersion": str(read_at)}
    # A session of its own: the worker's session goes on to other iterations, whose
    # session settings (transaction ids, MERGE options) the build must not see.
    builder = writer.on_session(context.spark.newSession())

    def work() -> IndexVersion:
        builder.context.spark.sparkContext.setJobGroup(
            f"lakeprop-index-build-{context.job_id}", f"index version {number}"
        )
        vectors = builder.tables.postings_of(live, at=read_at)
        return build_version(builder, vectors, None, dimension, number, read_at, because, txn=txn)

    log.info("building index version %s of %s: %s", number, postings, because)
    BUILDS.start(context.txn_app_id, Build(number, read_at, because), work)


def fence(writer: IndexWriter, number: int, app_id: str | None = None) -> int:
    """Make every build of index version ``number`` still under way anywhere skip
    its writes, and return the transaction version the caller writes it at next.

    A build left running by an instance that lost the job, or by an earlier owner,
    read the postings before now; committing the builds' app id at the postings'
    current version to the postings and the centroids makes Delta skip such a
    build's later writes, and fail one in flight with a conflict. ``app_id`` names
    the builds of another configuration of the job (a snapshot fences those of the
    configuration it replaces)."""
    app_id = app_id or build_app_id(writer, number)
    spark = writer.context.spark
    postings = writer.tables.postings
    at = DeltaLogProbe(spark).latest_version(postings.location())
    assert at is not None
    for table in (postings, writer.tables.beside(CENTROIDS)):
        empty = spark.createDataFrame([], table.load(table.reader()).schema)
        options = {"txnAppId": app_id, "txnVersion": str(at)}
        table.save(empty.write.format("delta").mode("append").options(**options))
    return at + 1


def reconcile(
    writer: IndexWriter, build: Build, live: IndexVersion, dimension: int, version: int
) -> IndexVersion:
    """The finished build, fenced and then made equal to the live version as it is
    now: one MERGE of every key whose row differs between the two.

    The diff does not assume which build's rows the version holds: another
    instance's build of the same version (the job moved away and back) may have
    replaced them after this one wrote, or replaced the version's centroids before
    this one's postings landed. So it compares the lists too: a posting whose list
    is not the nearest of the version's centroids as they are now moves to it."""
    opts, tables = writer.options, writer.tables
    after = fence(writer, build.number)
    target: IndexVersion = build.result
    built_rows, now = tables.postings_of(target), tables.postings_of(live)
    centroids = tables.centroids(build.number)
    placed = tables.postings_of(target, lists=True)
    misplaced = (
        writer.assigned(placed.drop("list_id"), centroids, dimension)
        .withColumnRenamed("list_id", "__nearest")
        .join(placed.select(*opts.key, "list_id"), list(opts.key))
        .where(F.col("__nearest") != F.col("list_id"))
        .select(*opts.key)
    )
    moved = (
        now.exceptAll(built_rows)
        .select(*opts.key)
        .unionByName(built_rows.exceptAll(now).select(*opts.key))
        .unionByName(misplaced)
        .distinct()
    )
    rows = moved.join(now, list(opts.key), "left")
    source = writer.assigned(rows, centroids, dimension).localCheckpoint()
    changed = int(source.count())
    if changed:
        app_id = build_app_id(writer, build.number)
        writer.merge(source, target, after, app_id)
    lists = len(centroids)
    built = replace(
        target,
        lists=lists,
        nprobe=min(opts.nprobe or ivf.default_nprobe(max(lists, 1)), max(lists, 1)),
        source_version=version,
        changed_rows=changed,
    )
    return tables.measure(built, recall=False)


def build_version(
    writer: IndexWriter,
    vectors: DataFrame,
    rows: int | None,
    dimension: int,
    number: int,
    version: int,
    because: str,
    *,
    fresh: bool = False,
    txn: Mapping[str, str] | None = None,
) -> IndexVersion:
    """Train, assign and write index version ``number`` (not live yet), once per
    ``txn`` (default: the snapshot's, by source version)."""
    opts, tables = writer.options, writer.tables
    if rows is None:
        rows = int(vectors.count())
    lists = min(opts.lists or ivf.default_lists(rows), max(rows, 1)) if rows else 0
    build_txn = dict(
        txn or {"txnAppId": f"{writer.context.txn_app_id}-build", "txnVersion": str(version)}
    )
    centroids = tables.trained(number, build_txn)
    if centroids is not None:
        lists = len(centroids)
    elif lists:
        wanted = min(MAX_SAMPLE, lists * SAMPLE_PER_LIST)
        fraction = min(1.0, 1.1 * wanted / rows)
        sample = vectors.sample(fraction=fraction, seed=number).select(opts.vector)
        table = sample.limit(wanted).toArrow()
        drawn = ivf.vector_array(table.column(0).combine_chunks(), dimension)
        centroids = ivf.train(drawn, lists, opts.metric, seed=number)
        lists = len(centroids)
    else:
        centroids = np.empty((0, dimension), dtype=np.float32)
    postings = tables.postings
    stored = [ivf.BYTES if c == opts.vector else c for c in opts.columns]
    ordered = writer.assigned(vectors, centroids, dimension).select(
        F.lit(number).cast("long").alias("index_version"), "list_id", *stored
    )
    # versions of another encoding or configuration keep their columns beside these
    # (NULL in this version's rows) unless a column's type changed
    replace_all = fresh and (
        not postings.exists() or not set(shape(ordered)) <= set(shape(postings))
    )
    tables.write_centroids(number, centroids, build_txn, replace_all)
    if not tables.done(postings, build_txn):
        out = (
            ordered.repartition("list_id")  # a file per list: a search opens few
            .write.format("delta")
            .partitionBy("index_version", "list_id")
            .mode("overwrite")
            .option("mergeSchema", "true")
            .options(**build_txn)
        )
        postings.save(replacing(out, number, replace_all or not postings.exists()))
    fault_point("index.written")
    built = IndexVersion(
        index_version=number,
        live=True,
        metric=opts.metric,
        dimension=dimension,
        lists=lists,
        nprobe=min(opts.nprobe or ivf.default_nprobe(max(lists, 1)), max(lists, 1)),
        trained_rows=rows,
        trained_source_version=version,
        source_version=version,
        built_because=because,
        built_by=writer.context.txn_app_id,
        encoding=ivf.ENCODING,
    )
    return tables.measure(built, recall=True)
