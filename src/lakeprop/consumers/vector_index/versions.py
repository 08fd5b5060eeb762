"""The index's versions: the ``<target>__index`` row of each, the centroids, and the
tables that hold them.

:class:`IndexTables` reads and writes the three tables of one job's index (the
postings, ``__centroids`` and ``__index``) and switches the pointer; the
consumer (:mod:`.consumer`) and the background builds (:mod:`.builds`) both go
through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, FloatType, StructField, StructType

from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.vector_index import ivf
from lakeprop.consumers.vector_index.options import VectorOptions
from lakeprop.spec import target_table
from lakeprop.state.schema import Float32, Int32, spark_schema
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import TableHandle

CENTROIDS, INDEX, QUARANTINE = "__centroids", "__index", "__quarantine"
"""Suffixes of the tables next to the postings."""
RECALL_SAMPLE = 4_000


@dataclass(frozen=True)
class Centroid:
    """One row of ``<target>__centroids``: a list's centroid in one index version."""

    index_version: int
    list_id: Int32
    centroid: list[Float32]


CENTROID_SCHEMA = spark_schema(Centroid)


@dataclass(frozen=True)
class IndexVersion:
    """One row of ``<target>__index``: an index version, its shape and its drift."""

    index_version: int
    live: bool
    metric: str
    dimension: Int32
    lists: Int32
    nprobe: Int32
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
    encoding: str = ivf.ENCODING
    """How its postings hold the vectors (:mod:`.ivf`); a row written before the
    column existed is of the ``array`` encoding."""

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> IndexVersion:
        fields = {f: row[f] for f in INDEX_SCHEMA.fieldNames() if f in row}
        if fields.get("encoding") is None:
            fields["encoding"] = ivf.LEGACY
        return cls(**fields)

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


INDEX_SCHEMA = spark_schema(IndexVersion)


def shape(data: TableHandle | DataFrame) -> list[tuple[str, str]]:
    """Column names and types, nullability aside (a stored table's columns are nullable)."""
    schema = data.load(data.reader()).schema if isinstance(data, TableHandle) else data.schema
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def decoded(stored: DataFrame, vector: str, dimension: int) -> DataFrame:
    """Postings of one ``float32`` index version with their vectors as ``vector``, an
    ``array<float>`` column in the place of the stored bytes."""
    kept = stored.drop(vector) if ivf.BYTES in stored.columns else stored
    schema = StructType(
        [
            StructField(vector, ArrayType(FloatType())) if f.name == ivf.BYTES else f
            for f in kept.schema.fields
        ]
    )
    return kept.mapInArrow(ivf.decoder(vector, dimension), schema)


def live_postings(postings: DataFrame, index: DataFrame, vector: str) -> DataFrame | None:
    """The live version's rows of a ``postings`` table whose pointer table is ``index``,
    the vector as ``array<float>`` whatever its encoding (None before a first
    version): what a notebook or a check reads."""
    row = index.where("live").first()
    if row is None:
        return None
    live = IndexVersion.of(row.asDict())
    rows = postings.where(F.col("index_version") == live.index_version)
    return rows if live.encoding == ivf.LEGACY else decoded(rows, vector, live.dimension)


def stored_column(vector: str, encoding: str) -> str:
    """The postings column holding the vectors of an index version of ``encoding``."""
    return vector if encoding == ivf.LEGACY else ivf.BYTES


def replacing(writer: Any, number: int, replace_all: bool) -> Any:
    """An overwrite of index version ``number``'s rows alone, or of the whole table.

    One commit replaces the rows of an attempt a crash cut short. Of two builds
    of one version writing at once (the job moved between instances), Delta
    fails the later commit; one that writes after the version went live is
    skipped by the switch's fence (:func:`~.builds.fence`)."""
    if replace_all:
        return writer.option("overwriteSchema", "true")
    return writer.option("replaceWhere", f"index_version = {int(number)}")


class IndexTables:
    """The postings, centroids and index pointer of one job's index."""

    def __init__(self, context: ConsumerContext, options: VectorOptions) -> None:
        self.context = context
        self.options = options
        self._names = target_table(context.key, context.options)
        self._postings: TableHandle | None = None

    @property
    def postings(self) -> TableHandle:
        if self._postings is None:
            self._postings = self.context.locate(*self._names)
        return self._postings

    def beside(self, suffix: str) -> TableHandle:
        """A table next to the postings: centroids, index pointer or quarantine."""
        database, table = self._names
        return self.context.locate(database, f"{table}{suffix}")

    # -- reading ---------------------------------------------------------------------

    def versions(self) -> list[IndexVersion]:
        table = self.beside(INDEX)
        if not table.exists():
            return []
        return [IndexVersion.of(r.asDict()) for r in table.load(table.reader()).collect()]

    def centroids(self, number: int) -> ivf.Vectors:
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

    def postings_of(
        self, index: IndexVersion, *, lists: bool = False, at: int | None = None
    ) -> DataFrame:
        """The key, vector (``array<float>``, whatever the encoding) and included
        columns of ``index``'s postings, with their ``list_id`` when ``lists``; as of
        the postings table's version ``at`` (default: the latest)."""
        postings, opts = self.postings, self.options
        reader = postings.reader() if at is None else postings.reader().option("versionAsOf", at)
        stored = [stored_column(c, index.encoding) if c == opts.vector else c for c in opts.columns]
        rows = (
            postings.load(reader)
            .where(F.col("index_version") == index.index_version)
            .select(*stored, *(["list_id"] if lists else []))
        )
        return rows if index.encoding == ivf.LEGACY else decoded(rows, opts.vector, index.dimension)

    def done(self, table: TableHandle, txn: Mapping[str, str]) -> bool:
        """Whether the write of ``txn`` (app id, version) already committed to ``table``."""
        if not table.exists():
            return False
        last = DeltaLogProbe(self.context.spark).last_transaction(table.location(), txn["txnAppId"])
        return last is not None and last >= int(txn["txnVersion"])

    def trained(self, number: int, txn: Mapping[str, str]) -> ivf.Vectors | None:
        """The centroids of version ``number`` when this build wrote them before a crash."""
        if not self.done(self.beside(CENTROIDS), txn):
            return None
        return self.centroids(number)

    def measure(self, index: IndexVersion, *, recall: bool = False) -> IndexVersion:
        """``index`` with its drift measured: list sizes always, the sampled recall
        at build time and every ``recall_check_every`` iterations."""
        postings = self.postings
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
                .select(stored_column(self.options.vector, index.encoding), "list_id")
                .limit(RECALL_SAMPLE)
                .toArrow()
            )
            if sample.num_rows:
                vectors = ivf.stored_vectors(sample.column(0), index.dimension, index.encoding)
                lists = sample.column(1).to_numpy()
                measured = replace(
                    measured,
                    recall=ivf.sampled_recall(
                        vectors,
                        lists,
                        self.centroids(index.index_version),
                        index.metric,
                        index.nprobe,
                    ),
                )
        return index.measured(measured)

    # -- writing ---------------------------------------------------------------------

    def write_centroids(
        self, number: int, centroids: ivf.Vectors, txn: Mapping[str, str], replace_all: bool
    ) -> None:
        table = self.beside(CENTROIDS)
        if self.done(table, txn):
            return
        frame = self.context.spark.createDataFrame(
            [(number, i, [float(x) for x in c]) for i, c in enumerate(centroids)],
            CENTROID_SCHEMA,
        )
        writer = frame.write.format("delta").mode("overwrite").options(**txn)
        table.save(replacing(writer, number, replace_all or not table.exists()))

    def write_index(self, rows: list[IndexVersion], version: int) -> None:
        frame = self.context.spark.createDataFrame(
            [tuple(asdict(r).values()) for r in rows], INDEX_SCHEMA
        )
        writer = (
            frame.coalesce(1)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .options(**self.context.writer_options(version))
        )
        self.beside(INDEX).save(writer)

    def switch(
        self, built: IndexVersion, previous: IndexVersion | None, version: int | None = None
    ) -> None:
        """Make ``built`` live in one commit, keep ``previous`` for readers in flight,
        and drop the versions before them (never a later one: an instance that lost
        the job may still run this after its successor switched further)."""
        kept = [built] + ([replace(previous, live=False)] if previous is not None else [])
        self.write_index(kept, built.source_version if version is None else version)
        old = {v.index_version for v in kept}
        stale = ~F.col("index_version").isin(sorted(old)) & (F.col("index_version") < max(old))
        for table in (self.postings, self.beside(CENTROIDS)):
            table.delta().delete(stale)
