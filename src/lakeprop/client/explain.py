"""``lakeprop explain``: a join view's sources, the versions each is joined at, its
keys, its technique and how each source's layout serves it
(:mod:`lakeprop.consumers.join_view.explain`), for a registered job or a proposed
one. Reads each table's Delta metadata (no Spark job)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from lakeprop.config import TablesConfig
from lakeprop.consumers.join_view.explain import Layout, explain
from lakeprop.consumers.join_view.options import NAME, parse_options
from lakeprop.errors import InvalidArgumentError, InvalidConsumerOptionsError
from lakeprop.spec import JobKey
from lakeprop.state.status import joined_marks
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import Tables


def explain_job(
    spark: SparkSession,
    tables: TablesConfig,
    key: JobKey,
    spec: Mapping[str, Any],
    registered: tuple[int | None, Mapping[str, Any]] | None = None,
) -> list[str]:
    """The explanation of the job ``key`` with ``spec``: ``registered`` is its
    (watermark, status) when it is registered, None for a proposed job (each table
    is then shown at its latest version, where the job would start)."""
    consumer = spec.get("iteration", {}).get("consumer", {})
    if consumer.get("type") != NAME:
        raise InvalidArgumentError(
            f"explain tells how a {NAME} job is kept; {key} is a {consumer.get('type')!r} job"
        )
    try:
        view = parse_options(consumer.get("options") or {})
    except InvalidConsumerOptionsError as exc:
        return [f"technique: none, the query cannot be kept incrementally: {exc}"]
    resolved = Tables(spark, tables)
    probe = DeltaLogProbe(spark)
    marks = {} if registered is None else joined_marks(json.dumps(registered[1]))
    versions: dict[str, str] = {}
    layouts: dict[str, Layout | None] = {}
    for n, source in enumerate(view.query.sources):
        handle = resolved.handle(source.database, source.table, spark)
        try:
            detail = handle.delta().detail().first()
        except Exception:  # missing, or not Delta: said in its line
            detail = None
        layouts[source.alias] = (
            None
            if detail is None
            else Layout(
                tuple(detail["partitionColumns"] or ()),
                tuple(detail.asDict().get("clusteringColumns") or ()),
            )
        )
        if registered is None:
            latest = None if detail is None else probe.latest_version(handle.location())
            versions[source.alias] = (
                "missing"
                if latest is None
                else f"version {latest} (latest: a new job starts there)"
            )
        elif n == 0:
            watermark = registered[0]
            versions[source.alias] = (
                "no version yet" if watermark is None else f"version {watermark}"
            )
        else:
            mark = marks.get(source.name)
            versions[source.alias] = "no version yet" if mark is None else f"version {mark.version}"
    return explain(view, versions, layouts)
