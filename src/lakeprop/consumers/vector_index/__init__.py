"""``vector_index``: an IVF index of a vector column, kept as Delta tables.

Options::

    {"key": ["id"],                    # required: the source's key
     "vector": "embedding",            # required: array<float> or array<double>
     "metric": "l2",                   # l2 (default), cosine or inner_product
     "lists": 316,                     # optional: rows/1,000 up to 1M rows, sqrt(rows) above
     "nprobe": 18,                     # optional: default search width, sqrt(lists), >= 4
     "include": ["category", "title"], # optional: columns kept for filters and results
     "dimension": 128,                 # optional: else the snapshot's most common one
     "quarantine": false,              # bad vectors to <target>__quarantine, not an error
     "retrain": {"max_imbalance": 5.0, "max_empty_share": 0.25,
                 "max_changed_share": 0.5, "min_recall": 0.9,
                 "recall_check_every": 10, "enabled": true},
     "target_database": "search", "target_table": "docs_vectors"}

Three Delta tables hold the index:

* ``<target>``, the postings: ``index_version``, ``list_id``, the key, the
  vector (``array<float>``, unit length for ``cosine``) and the included
  columns, **partitioned by** ``(index_version, list_id)``. A search reads the
  files of the lists it probes and no others, pruned from the Delta log by
  partition values alone; clustering would leave file boundaries to OPTIMIZE
  and mix lists in a file.
* ``<target>__centroids``: ``index_version``, ``list_id``, ``centroid``.
* ``<target>__index``: one row per kept index version, with its shape, its
  drift measures and ``live``; the live row is the pointer a reader follows.

A **snapshot** trains the centroids on a sample in the driver (numpy k-means),
assigns every vector to its list on the executors (``mapInArrow``), writes
the new version's postings and centroids, and then switches the pointer in one
commit. A **tail** applies the last change of each key with one MERGE into
the live version: a deleted key (or one whose vector became NULL) leaves the
index, an inserted or updated vector goes to the nearest live centroid's list
and its old posting goes. Then drift is measured; past a threshold of the
``retrain`` policy a new version is built in the background from the live
postings (:mod:`.builds`) while tails go on against the live version; the
first tail that finds it finished fences it against other builds of its
version, makes it equal to the live version and switches the pointer. The
previous version stays until the next switch, so a reader that followed the
old pointer still finds it whole.

A NULL vector means "not indexed". A vector of the wrong dimension or holding
a NaN, infinity or NULL element is a permanent error naming keys; with
``quarantine`` such rows go to ``<target>__quarantine`` with the reason instead
(and their key leaves the index).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import reduce
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from lakeprop.consumers.base import TXN_APP_ID, TXN_VERSION, Consumer, ConsumerContext
from lakeprop.consumers.vector_index import ivf
from lakeprop.consumers.vector_index.builds import BUILDS, Build
from lakeprop.consumers.vector_index.options import NAME, VectorOptions, validate
from lakeprop.errors import (
    ErrorCode,
    InvalidConsumerOptionsError,
    PermanentError,
    TemporaryError,
)
from lakeprop.faults import fault_point
from lakeprop.spec import target_table
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import TableHandle

log = logging.getLogger("lakeprop.vector_index")
CENTROIDS, INDEX, QUARANTINE = "__centroids", "__index", "__quarantine"
REASON = "__reason"
_DELETE = "__delete"
SAMPLE_PER_LIST = 128
MAX_SAMPLE = 200_000
RECALL_SAMPLE = 4_000
EXAMPLES = 10
BUILD_WAIT = 600.0
"""Seconds a snapshot waits for a build of the job's earlier configuration to end."""
CENTROID_SCHEMA = StructType(
    [
        StructField("index_version", LongType(), False),
        StructField("list_id", IntegerType(), False),
        StructField("centroid", ArrayType(FloatType()), False),
    ]
)


class VectorError(PermanentError):
    """Vectors that cannot be indexed: the range is not written."""

    default_code = ErrorCode.CONSUMER_FAILED


@dataclass(frozen=True)
class IndexVersion:
    """One row of ``<target>__index``: an index version, its shape and its drift."""

    index_version: int
    live: bool
    metric: str
    dimension: int
    lists: int
    nprobe: int
    trained_rows: int
    trained_source_version: int
    source_version: int
    """The last source version applied to it."""
    changed_rows: int = 0
    """Vectors inserted, updated or deleted since training."""
    iterations: int = 0
    """Tails applied since training."""
    imbalance: float = 1.0
    empty_share: float = 0.0
    recall: float | None = None
    """The last sampled recall@10 at ``nprobe``."""
    built_because: str = "snapshot"
    built_by: str = ""
    """The transaction app id of the job configuration that built it."""

    SCHEMA = StructType(
        [
            StructField("index_version", LongType(), False),
            StructField("live", BooleanType(), False),
            StructField("metric", StringType(), False),
            StructField("dimension", IntegerType(), False),
            StructField("lists", IntegerType(), False),
            StructField("nprobe", IntegerType(), False),
            StructField("trained_rows", LongType(), False),
            StructField("trained_source_version", LongType(), False),
            StructField("source_version", LongType(), False),
            StructField("changed_rows", LongType(), False),
            StructField("iterations", LongType(), False),
            StructField("imbalance", DoubleType(), False),
            StructField("empty_share", DoubleType(), False),
            StructField("recall", DoubleType(), True),
            StructField("built_because", StringType(), False),
            StructField("built_by", StringType(), False),
        ]
    )

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> IndexVersion:
        return cls(**{f: row[f] for f in cls.SCHEMA.fieldNames()})

    def measured(self, drift: ivf.Drift) -> IndexVersion:
        recall = self.recall if drift.recall is None else drift.recall
        return replace(
            self, imbalance=drift.imbalance, empty_share=drift.empty_share, recall=recall
        )

    def drift(self) -> ivf.Drift:
        return ivf.Drift(
            imbalance=self.imbalance,
            empty_share=self.empty_share,
            changed_share=self.changed_rows / max(self.trained_rows, 1),
            recall=self.recall,
        )


def _shape(data: TableHandle | DataFrame) -> list[tuple[str, str]]:
    """Column names and types, nullability aside (a stored table's columns are nullable)."""
    schema = data.load(data.reader()).schema if isinstance(data, TableHandle) else data.schema
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _replacing(writer: Any, number: int, replace_all: bool) -> Any:
    """An overwrite of index version ``number``'s rows alone, or of the whole table.

    One commit replaces the rows of an attempt a crash cut short. Of two builds
    of one version writing at once (the job moved between instances), Delta
    fails the later commit; one that writes after the version went live is
    skipped by the switch's fence (``VectorIndexConsumer._fence``)."""
    if replace_all:
        return writer.option("overwriteSchema", "true")
    return writer.option("replaceWhere", f"index_version = {int(number)}")


def vector_array(vectors: Any, dimension: int) -> ivf.Vectors:
    """An Arrow list column of equal-length vectors (no NULLs) as an ``(n, d)`` array."""
    flat = vectors.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(-1, dimension)


def assigner(
    centroids: ivf.Vectors, metric: str, column: str, dimension: int
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function adding ``list_id``: the nearest centroid of each
    non-NULL vector, -1 for a NULL one (a delete)."""

    def assign(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            vectors = batch.column(column)
            ids = np.full(batch.num_rows, -1, dtype=np.int32)
            valid = pc.is_valid(vectors).to_numpy(zero_copy_only=False)
            if valid.any():
                present = vector_array(vectors.filter(pa.array(valid)), dimension)
                ids[valid] = ivf.assign(present, centroids, metric) if len(centroids) else 0
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(ids, pa.int32())],
                names=[*batch.schema.names, "list_id"],
            )

    return assign


class VectorIndexConsumer(Consumer):
    """An IVF index of a vector column: postings by list, centroids, a version pointer."""

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return validate(options)

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return VectorOptions.of(options).columns

    @classmethod
    def check_source(
        cls, options: Mapping[str, Any], schema: StructType, spark: SparkSession
    ) -> None:
        vector = VectorOptions.of(options).vector
        found = {f.name.lower(): f for f in schema.fields}[vector.lower()]
        data_type = found.dataType
        if not (
            isinstance(data_type, ArrayType)
            and isinstance(data_type.elementType, FloatType | DoubleType)
        ):
            raise InvalidConsumerOptionsError(
                f"{NAME} vector column {vector!r} is {data_type.simpleString()}; it must be "
                "array<float> or array<double>"
            )

    @classmethod
    def key_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return list(options["key"])

    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        self.options = VectorOptions.of(context.options)
        self._names = target_table(context.key, context.options)

    def beside(self, suffix: str) -> TableHandle:
        """A table next to the postings: centroids, index pointer or quarantine."""
        database, table = self._names
        return self.context.locate(database, f"{table}{suffix}")

    # -- the contract ---------------------------------------------------------------

    def snapshot(self, rows: DataFrame, version: int) -> int:
        opts = self.options
        if not BUILDS.wait(f"lakeprop-{self.context.job_id}-", BUILD_WAIT):
            raise TemporaryError(
                f"{NAME}: a build of an earlier configuration of job {self.context.job_id} "
                f"still runs after {BUILD_WAIT:.0f}s; the snapshot waits for it"
            )
        previous = self._versions()
        live = next((v for v in previous if v.live), None)
        if live is not None and (live.trained_source_version, live.built_by) == (
            version,
            self.context.txn_app_id,
        ):
            return live.trained_rows  # built and switched to before a crash
        rows = rows.select(*opts.columns)
        dimension = opts.dimension or self._common_dimension(rows)
        good = self._checked(rows, dimension, version, version)
        number = (live.index_version + 1) if live is not None else 1
        built = self._build(good, None, dimension, number, version, "snapshot", fresh=True)
        self._switch(built, live)
        return built.trained_rows

    def _common_dimension(self, rows: DataFrame) -> int:
        """The most common length of the vectors in ``rows`` (0 when there are none)."""
        vector = self.options.vector
        sizes = {
            r["d"]: r["n"]
            for r in rows.where(F.col(vector).isNotNull())
            .groupBy(F.size(vector).alias("d"))
            .agg(F.count("*").alias("n"))
            .collect()
        }
        return max(sizes, key=lambda d: (sizes[d], -d)) if sizes else 0

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        opts = self.options
        versions = self._versions()
        live = next((v for v in versions if v.live), None)
        postings = self.require_target()
        if live is None:
            raise PermanentError(
                f"{NAME} index {postings} has no live version; resync the job to rebuild it",
                ErrorCode.TARGET_MISSING,
            )
        if live.source_version >= to_version:
            return 0  # applied before a crash: the pointer is written last
        latest = self.context.latest_changes(changes, opts.key)
        latest = latest.withColumn(
            opts.vector,
            F.when(F.col("_change_type") != "delete", F.col(opts.vector)),
        ).select(*opts.columns)
        dimension = live.dimension or opts.dimension or 0
        if not dimension:  # an index still empty learns its dimension from its first vectors
            first = latest.where(F.col(opts.vector).isNotNull()).select(F.size(opts.vector)).first()
            dimension = int(first[0]) if first is not None else 0
        source = self._assigned(
            self._checked(latest, dimension, from_version + 1, to_version, keep_deletes=True),
            self._centroids(live.index_version),
            dimension,
        ).localCheckpoint()
        written = int(source.count())
        if written:
            self._merge(postings, source, live.index_version, to_version)
        updated = replace(
            live,
            dimension=dimension,
            source_version=to_version,
            changed_rows=live.changed_rows + written,
            iterations=live.iterations + 1,
        )
        measured = self._measure(updated)
        reasons = opts.retrain.reasons(measured.drift())
        if live.lists == 0 and written:
            reasons = ["untrained"]
        app_id = self.context.txn_app_id
        build = BUILDS.get(app_id)
        if build is not None and build.done:
            BUILDS.forget(app_id)
            if build.error is None and build.number == live.index_version + 1:
                built = self._reconcile(build, live.index_version, dimension, to_version)
                self._switch(built, replace(measured, live=False), to_version)
                return written
            build = None  # failed, or of a version switched to since: start again if need be
        if reasons and build is None:
            self._start_build(live.index_version + 1, dimension, "; ".join(reasons))
        self._write_index([measured, *(v for v in versions if not v.live)], to_version)
        return written

    # -- re-training in the background -------------------------------------------------

    def _start_build(self, number: int, dimension: int, because: str) -> None:
        """Build index version ``number`` from the live postings as they are now, on a
        thread of its own: tails go on against the live version meanwhile."""
        postings = self.target
        read_at = DeltaLogProbe(self.context.spark).latest_version(postings.location())
        assert read_at is not None
        txn = {"txnAppId": self._build_app_id(number), "txnVersion": str(read_at)}
        # A session of its own: the worker's session goes on to other iterations, whose
        # session settings (transaction ids, MERGE options) the build must not see.
        session = self.context.spark.newSession()
        locate = self.context.locate
        builder = type(self)(
            dataclasses.replace(
                self.context,
                spark=session,
                locate=lambda d, t: dataclasses.replace(locate(d, t), spark=session),
            )
        )

        def work() -> IndexVersion:
            session.sparkContext.setJobGroup(
                f"lakeprop-index-build-{self.context.job_id}", f"index version {number}"
            )
            vectors = (
                builder.target.load(builder.target.reader().option("versionAsOf", read_at))
                .where(F.col("index_version") == number - 1)
                .select(*self.options.columns)
            )
            return builder._build(vectors, None, dimension, number, read_at, because, txn=txn)

        log.info("building index version %s of %s: %s", number, self.target, because)
        BUILDS.start(self.context.txn_app_id, Build(number, read_at, because), work)

    def _reconcile(
        self, build: Build, live_number: int, dimension: int, version: int
    ) -> IndexVersion:
        """The finished build, fenced and then made equal to the live version as it is
        now: one MERGE of every key whose row differs between the two.

        The diff does not assume which build's rows the version holds: another
        instance's build of the same version (the job moved away and back) may have
        replaced them after this one wrote."""
        opts = self.options
        after = self._fence(build.number)
        built_rows, now = self._live_postings(build.number), self._live_postings(live_number)
        moved = (
            now.exceptAll(built_rows)
            .select(*opts.key)
            .unionByName(built_rows.exceptAll(now).select(*opts.key))
            .distinct()
        )
        centroids = self._centroids(build.number)
        rows = moved.join(now, list(opts.key), "left")
        source = self._assigned(rows, centroids, dimension).localCheckpoint()
        changed = int(source.count())
        if changed:
            app_id = self._build_app_id(build.number)
            self._merge(self.target, source, build.number, after, app_id=app_id)
        lists = len(centroids)
        built: IndexVersion = replace(
            build.result,
            lists=lists,
            nprobe=min(opts.nprobe or ivf.default_nprobe(max(lists, 1)), max(lists, 1)),
            source_version=version,
            changed_rows=changed,
        )
        return self._measure(built, recall=False)

    def _build_app_id(self, number: int) -> str:
        """The Delta transaction app id of background builds of index version ``number``;
        its versions are postings table versions."""
        return f"{self.context.txn_app_id}-v{number}"

    def _fence(self, number: int) -> int:
        """Make every build of index version ``number`` still under way anywhere skip
        its writes, and return the transaction version the caller writes it at next.

        A build left running by an instance that lost the job, or by an earlier owner,
        read the postings before now; committing the builds' app id at the postings'
        current version to the postings and the centroids makes Delta skip such a
        build's later writes, and fail one in flight with a conflict."""
        app_id = self._build_app_id(number)
        at = DeltaLogProbe(self.context.spark).latest_version(self.target.location())
        assert at is not None
        for table in (self.target, self.beside(CENTROIDS)):
            empty = self.context.spark.createDataFrame([], table.load(table.reader()).schema)
            options = {"txnAppId": app_id, "txnVersion": str(at)}
            table.save(empty.write.format("delta").mode("append").options(**options))
        return at + 1

    # -- vectors in -----------------------------------------------------------------

    def _checked(
        self,
        rows: DataFrame,
        dimension: int,
        first_version: int,
        version: int,
        *,
        keep_deletes: bool = False,
    ) -> DataFrame:
        """The rows whose vectors can be indexed, cast to ``array<float>`` (unit length
        for ``cosine``); a bad vector is an error naming keys, or with ``quarantine``
        its row goes to the quarantine table (and its key, as a NULL vector, leaves
        the index). NULL vectors are dropped, or kept with ``keep_deletes``."""
        opts = self.options
        vector = F.col(opts.vector)
        reason = (
            F.when(vector.isNull(), F.lit(None))
            .when(
                F.size(vector) != F.lit(dimension),
                F.concat(
                    F.lit("dimension "), F.size(vector).cast("string"), F.lit(f", not {dimension}")
                ),
            )
            .when(
                F.exists(
                    vector, lambda x: x.isNull() | F.isnan(x) | (F.abs(x) == F.lit(float("inf")))
                ),
                F.lit("a NaN, infinite or NULL element"),
            )
        )
        checked = rows.withColumn(REASON, reason)
        bad = checked.where(F.col(REASON).isNotNull())
        examples = bad.select(*opts.key, REASON).limit(EXAMPLES).collect()
        self._quarantine(bad, version, bool(examples))
        if examples and not opts.quarantine:
            named = [{**{k: r[k] for k in opts.key}, "reason": r[REASON]} for r in examples]
            raise VectorError(
                f"{NAME}: vectors of versions {first_version}..{version} cannot be indexed, e.g. "
                f"{named}; fix the source, or register the job with quarantine: true to set "
                "such rows aside"
            )
        cleaned = F.when(F.col(REASON).isNull(), vector.cast(ArrayType(FloatType())))
        if opts.metric == "cosine":
            norm = F.sqrt(F.aggregate(cleaned, F.lit(0.0), lambda acc, x: acc + x * x))
            cleaned = F.when(norm > 0, F.transform(cleaned, lambda x: (x / norm).cast("float")))
            cleaned = F.coalesce(
                cleaned, F.when(F.col(REASON).isNull(), vector.cast(ArrayType(FloatType())))
            )
        out = checked.withColumn(opts.vector, cleaned).drop(REASON)
        return out if keep_deletes else out.where(F.col(opts.vector).isNotNull())

    def _quarantine(self, bad: DataFrame, version: int, found: bool) -> None:
        if not (found and self.options.quarantine):
            return
        writer = (
            bad.withColumn("__source_version", F.lit(version).cast("long"))
            .write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .options(**self.context.writer_options(version))
        )
        self.beside(QUARANTINE).save(writer)

    def _assigned(self, rows: DataFrame, centroids: ivf.Vectors, dimension: int) -> DataFrame:
        """``rows`` with ``list_id``: the nearest centroid (-1 for a NULL vector)."""
        opts = self.options
        schema = StructType([*rows.schema.fields, StructField("list_id", IntegerType(), False)])
        return rows.mapInArrow(assigner(centroids, opts.metric, opts.vector, dimension), schema)

    # -- building and switching versions ---------------------------------------------

    def _build(
        self,
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
        opts = self.options
        if rows is None:
            rows = int(vectors.count())
        lists = min(opts.lists or ivf.default_lists(rows), max(rows, 1)) if rows else 0
        build_txn = dict(
            txn or {"txnAppId": f"{self.context.txn_app_id}-build", "txnVersion": str(version)}
        )
        centroids = self._trained(number, build_txn)
        if centroids is not None:
            lists = len(centroids)
        elif lists:
            wanted = min(MAX_SAMPLE, lists * SAMPLE_PER_LIST)
            fraction = min(1.0, 1.1 * wanted / rows)
            sample = vectors.sample(fraction=fraction, seed=number).select(opts.vector)
            table = sample.limit(wanted).toArrow()
            drawn = vector_array(table.column(0).combine_chunks(), dimension)
            centroids = ivf.train(drawn, lists, opts.metric, seed=number)
            lists = len(centroids)
        else:
            centroids = np.empty((0, dimension), dtype=np.float32)
        postings = self.target
        ordered = self._assigned(vectors, centroids, dimension).select(
            F.lit(number).cast("long").alias("index_version"), "list_id", *opts.columns
        )
        replace_all = fresh and (not postings.exists() or _shape(postings) != _shape(ordered))
        self._write_centroids(number, centroids, build_txn, replace_all)
        if not self._done(postings, build_txn):
            writer = (
                ordered.write.format("delta")
                .partitionBy("index_version", "list_id")
                .mode("overwrite")
                .options(**build_txn)
            )
            postings.save(_replacing(writer, number, replace_all or not postings.exists()))
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
            built_by=self.context.txn_app_id,
        )
        return self._measure(built, recall=True)

    @contextmanager
    def _transaction(self, app_id: str | None, version: int) -> Iterator[None]:
        """Delta writes inside happen once per (``app_id``, ``version``); the job's
        own app id by default (``ConsumerContext.idempotent``)."""
        if app_id is None:
            with self.context.idempotent(version):
                yield
            return
        conf = self.context.spark.conf
        conf.set(TXN_APP_ID, app_id)
        conf.set(TXN_VERSION, str(version))
        try:
            yield
        finally:
            conf.unset(TXN_APP_ID)
            conf.unset(TXN_VERSION)

    def _done(self, table: TableHandle, txn: Mapping[str, str]) -> bool:
        """Whether the write of ``txn`` (app id, version) already committed to ``table``."""
        if not table.exists():
            return False
        last = DeltaLogProbe(self.context.spark).last_transaction(table.location(), txn["txnAppId"])
        return last is not None and last >= int(txn["txnVersion"])

    def _trained(self, number: int, txn: Mapping[str, str]) -> ivf.Vectors | None:
        """The centroids of version ``number`` when this build wrote them before a crash."""
        table = self.beside(CENTROIDS)
        if not self._done(table, txn):
            return None
        return self._centroids(number)

    def _write_centroids(
        self, number: int, centroids: ivf.Vectors, txn: Mapping[str, str], replace_all: bool
    ) -> None:
        table = self.beside(CENTROIDS)
        if self._done(table, txn):
            return
        frame = self.context.spark.createDataFrame(
            [(number, i, [float(x) for x in c]) for i, c in enumerate(centroids)],
            CENTROID_SCHEMA,
        )
        writer = frame.write.format("delta").mode("overwrite").options(**txn)
        table.save(_replacing(writer, number, replace_all or not table.exists()))

    def _switch(
        self, built: IndexVersion, previous: IndexVersion | None, version: int | None = None
    ) -> None:
        """Make ``built`` live in one commit, keep ``previous`` for readers in flight,
        and drop the versions before them (never a later one: an instance that lost
        the job may still run this after its successor switched further)."""
        kept = [built] + ([replace(previous, live=False)] if previous is not None else [])
        self._write_index(kept, built.source_version if version is None else version)
        old = {v.index_version for v in kept}
        stale = ~F.col("index_version").isin(sorted(old)) & (F.col("index_version") < max(old))
        for table in (self.target, self.beside(CENTROIDS)):
            table.delta().delete(stale)

    def _write_index(self, rows: list[IndexVersion], version: int) -> None:
        frame = self.context.spark.createDataFrame(
            [tuple(asdict(r).values()) for r in rows], IndexVersion.SCHEMA
        )
        writer = (
            frame.coalesce(1)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .options(**self.context.writer_options(version))
        )
        self.beside(INDEX).save(writer)

    # -- reading the index back ------------------------------------------------------

    def _versions(self) -> list[IndexVersion]:
        table = self.beside(INDEX)
        if not table.exists():
            return []
        return [IndexVersion.of(r.asDict()) for r in table.load(table.reader()).collect()]

    def _centroids(self, number: int) -> ivf.Vectors:
        table = self.beside(CENTROIDS)
        rows = (
            table.load(table.reader())
            .where(F.col("index_version") == number)
            .orderBy("list_id")
            .collect()
        )
        if not rows:
            return np.empty((0, 0), dtype=np.float32)
        return np.asarray([r["centroid"] for r in rows], dtype=np.float32)

    def _live_postings(self, number: int) -> DataFrame:
        postings = self.target
        return (
            postings.load(postings.reader())
            .where(F.col("index_version") == number)
            .select(*self.options.columns)
        )

    def _measure(self, index: IndexVersion, *, recall: bool = False) -> IndexVersion:
        """``index`` with its drift measured: list sizes always, the sampled recall
        at build time and every ``recall_check_every`` iterations."""
        postings = self.target
        live = postings.load(postings.reader()).where(F.col("index_version") == index.index_version)
        sizes = {
            int(r["list_id"]): int(r["n"])
            for r in live.groupBy("list_id").agg(F.count("*").alias("n")).collect()
        }
        measured = ivf.drift(sizes, index.lists, index.changed_rows, index.trained_rows)
        if index.lists and (recall or self.options.retrain.check_recall(index.iterations)):
            total = sum(sizes.values())
            fraction = min(1.0, 1.1 * RECALL_SAMPLE / max(total, 1))
            sample = (
                live.sample(fraction=fraction, seed=index.iterations)
                .select(self.options.vector, "list_id")
                .limit(RECALL_SAMPLE)
                .toArrow()
            )
            if sample.num_rows:
                vectors = vector_array(sample.column(0).combine_chunks(), index.dimension)
                lists = sample.column(1).to_numpy()
                measured = replace(
                    measured,
                    recall=ivf.sampled_recall(
                        vectors,
                        lists,
                        self._centroids(index.index_version),
                        index.metric,
                        index.nprobe,
                    ),
                )
        return index.measured(measured)

    def _merge(
        self,
        postings: TableHandle,
        source: DataFrame,
        number: int,
        version: int,
        app_id: str | None = None,
    ) -> None:
        opts = self.options
        matched = [F.col(f"t.{k}") == F.col(f"s.{k}") for k in opts.key]
        on: Column = reduce(
            lambda a, b: a & b,
            [*matched, F.col("t.index_version") == F.lit(number)],
        )
        kept = ["list_id", opts.vector, *opts.include]
        deleted = F.col(f"s.{opts.vector}").isNull()
        with self._transaction(app_id, version), self.context.merging_held():
            (
                postings.delta()
                .alias("t")
                .merge(source.alias("s"), on)
                .whenMatchedDelete(condition=deleted)
                .whenMatchedUpdate(set={c: F.col(f"s.{c}") for c in kept})
                .whenNotMatchedInsert(
                    condition=~deleted,
                    values={
                        "index_version": F.lit(number).cast("long"),
                        **{c: F.col(f"s.{c}") for c in [*opts.key, *kept]},
                    },
                )
                .execute()
            )
