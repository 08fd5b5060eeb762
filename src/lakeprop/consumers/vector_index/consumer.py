"""The ``vector_index`` consumer: the contract, the vectors in, and the MERGE.

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    FloatType,
    IntegerType,
    StructField,
    StructType,
)

from lakeprop.consumers.base import TXN_APP_ID, TXN_VERSION, Consumer, ConsumerContext
from lakeprop.consumers.vector_index import builds, ivf
from lakeprop.consumers.vector_index.options import NAME, VectorOptions, validate
from lakeprop.consumers.vector_index.versions import (
    IndexTables,
    IndexVersion,
    stored_column,
)
from lakeprop.errors import (
    ErrorCode,
    InvalidConsumerOptionsError,
    PermanentError,
    TemporaryError,
)

REASON, SOURCE_VERSION = "__reason", "__source_version"
EXAMPLES = 10
BUILD_WAIT = 600.0
"""Seconds a snapshot waits for a build of the job's earlier configuration to end."""


class VectorError(PermanentError):
    """Vectors that cannot be indexed: the range is not written."""

    default_code = ErrorCode.CONSUMER_FAILED


class VectorIndexConsumer(Consumer):
    """An IVF index of a vector column: postings by list, centroids, a version pointer."""

    table_target = False  # postings, centroids and a pointer, read through search

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
        self.tables = IndexTables(context, self.options)

    def on_session(self, session: SparkSession) -> VectorIndexConsumer:
        """The same consumer on another session (a background build's own)."""
        locate = self.context.locate
        return type(self)(
            dataclasses.replace(
                self.context,
                spark=session,
                locate=lambda d, t: dataclasses.replace(locate(d, t), spark=session),
            )
        )

    # -- the contract ---------------------------------------------------------------

    def snapshot(self, rows: DataFrame, version: int) -> int:
        opts = self.options
        if not builds.BUILDS.wait(f"lakeprop-{self.context.job_id}-", BUILD_WAIT):
            raise TemporaryError(
                f"{NAME}: a build of an earlier configuration of job {self.context.job_id} "
                f"still runs after {BUILD_WAIT:.0f}s; the snapshot waits for it"
            )
        previous = self.tables.versions()
        live = next((v for v in previous if v.live), None)
        if live is not None and (live.trained_source_version, live.built_by) == (
            version,
            self.context.txn_app_id,
        ):  # built and switched to before a crash: only its quarantine may be missing
            self._set_aside(rows.select(*opts.columns), live.dimension, version)
            return live.trained_rows
        if live is not None and live.built_by and live.built_by != self.context.txn_app_id:
            # a build of the configuration this snapshot replaces may still run on an
            # instance that served the job before: it would write the next version
            number = live.index_version + 1
            builds.fence(self, number, f"{live.built_by}-v{number}")
        rows = rows.select(*opts.columns)
        dimension = opts.dimension or self._common_dimension(rows)
        good = self._checked(rows, dimension, version, version)
        number = (live.index_version + 1) if live is not None else 1
        built = builds.build_version(
            self, good, None, dimension, number, version, "snapshot", fresh=True
        )
        self.tables.switch(built, live)
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
        opts, tables = self.options, self.tables
        versions = tables.versions()
        live = next((v for v in versions if v.live), None)
        postings = self.require_target()
        if live is None:
            raise PermanentError(
                f"{NAME} index {postings} has no live version; resync the job to rebuild it",
                ErrorCode.TARGET_MISSING,
            )
        latest = self.context.latest_changes(changes, opts.key)
        latest = latest.withColumn(
            opts.vector,
            F.when(F.col("_change_type") != "delete", F.col(opts.vector)),
        ).select(*opts.columns, F.col("_commit_version").cast("long").alias(SOURCE_VERSION))
        if live.source_version >= to_version:
            # applied before a crash (the pointer is written last): only its quarantine
            # may be missing, and the engine writes what it has not taken yet
            self._set_aside(latest, live.dimension, to_version)
            return 0
        dimension = live.dimension or opts.dimension or 0
        if not dimension:  # an index still empty learns its dimension from its first vectors
            first = latest.where(F.col(opts.vector).isNotNull()).select(F.size(opts.vector)).first()
            dimension = int(first[0]) if first is not None else 0
        source = self.assigned(
            self._checked(latest, dimension, from_version + 1, to_version, keep_deletes=True),
            tables.centroids(live.index_version),
            dimension,
        ).localCheckpoint()
        written = int(source.count())
        if written:
            self.merge(source, live, to_version)
        updated = replace(
            live,
            dimension=dimension,
            source_version=to_version,
            changed_rows=live.changed_rows + written,
            iterations=live.iterations + 1,
        )
        measured = tables.measure(updated)
        reasons = opts.retrain.reasons(measured.drift())
        if live.lists == 0 and written:
            reasons = ["untrained"]
        if live.encoding != ivf.ENCODING:
            reasons.append(f"its postings are in the {live.encoding} encoding")
        app_id = self.context.txn_app_id
        build = builds.BUILDS.get(app_id)
        if build is not None and build.done:
            builds.BUILDS.forget(app_id)
            if build.error is None and build.number == live.index_version + 1:
                built = builds.reconcile(self, build, live, dimension, to_version)
                tables.switch(built, replace(measured, live=False), to_version)
                return written
            build = None  # failed, or of a version switched to since: start again if need be
        if reasons and build is None:
            builds.start(self, live, dimension, "; ".join(reasons))
        tables.write_index([measured, *(v for v in versions if not v.live)], to_version)
        return written

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
        checked = rows.withColumn(REASON, self._reason(dimension))
        bad = checked.where(F.col(REASON).isNotNull())
        examples = bad.select(*opts.key, REASON).limit(EXAMPLES).collect()
        if examples and opts.quarantine:
            self._quarantine(bad, version)
        checked = checked.drop(SOURCE_VERSION)
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

    def _reason(self, dimension: int) -> Column:
        """Why a row's vector cannot be indexed at ``dimension`` (NULL: it can)."""
        vector = F.col(self.options.vector)
        return (
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

    def _quarantine(self, bad: DataFrame, version: int) -> None:
        """The bad rows set aside for the engine to write (the quarantine contract:
        :meth:`ConsumerContext.quarantine`), each with the version it came in: a
        tail's own commit's, a snapshot's ``version``."""
        if SOURCE_VERSION not in bad.columns:
            bad = bad.withColumn(SOURCE_VERSION, F.lit(version).cast("long"))
        self.context.quarantine(bad)

    def _set_aside(self, rows: DataFrame, dimension: int, version: int) -> None:
        """With ``quarantine``: the rows of ``rows`` whose vectors are bad, set aside
        (for a range applied before a crash, whose quarantine may not be)."""
        if self.options.quarantine and dimension:
            checked = rows.withColumn(REASON, self._reason(dimension))
            self._quarantine(checked.where(F.col(REASON).isNotNull()), version)

    def assigned(self, rows: DataFrame, centroids: ivf.Vectors, dimension: int) -> DataFrame:
        """``rows`` with ``list_id`` (the nearest centroid, -1 for a NULL vector) and the
        vector's bytes (:data:`.ivf.BYTES`)."""
        opts = self.options
        schema = StructType(
            [
                *rows.schema.fields,
                StructField("list_id", IntegerType(), False),
                StructField(ivf.BYTES, BinaryType()),
            ]
        )
        return rows.mapInArrow(ivf.assigner(centroids, opts.metric, opts.vector, dimension), schema)

    # -- the MERGE -------------------------------------------------------------------

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

    def merge(
        self, source: DataFrame, index: IndexVersion, at: int, app_id: str | None = None
    ) -> None:
        """MERGE ``source`` (:meth:`assigned` rows; a NULL vector deletes) into the
        postings of ``index``, once per (app id, transaction version ``at``)."""
        opts, number = self.options, index.index_version
        matched = [F.col(f"t.{k}") == F.col(f"s.{k}") for k in opts.key]
        on: Column = reduce(
            lambda a, b: a & b,
            [*matched, F.col("t.index_version") == F.lit(number)],
        )
        kept = ["list_id", stored_column(opts.vector, index.encoding), *opts.include]
        deleted = F.col(f"s.{opts.vector}").isNull()
        with self._transaction(app_id, at), self.context.merging_held():
            (
                self.tables.postings.delta()
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
