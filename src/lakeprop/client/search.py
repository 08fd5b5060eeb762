"""Search a ``fulltext_index`` job's index without Spark: the query is tokenized as
the job's tokenizer indexes, and matching documents are ranked with BM25.

    from lakeprop.client.search import search
    for hit in search(config, JobKey(0, "kb", "articles", "text"), "delta merge"):
        print(hit.score, hit.key)

The CLI does the same: ``lakeprop search --database kb --table articles --name text
"delta merge"``. The index is read with delta-rs and ranked with Arrow
(:mod:`lakeprop.client.lake`): no Spark session starts. BM25 is computed as
:func:`lakeprop.consumers.fulltext_index.bm25_search` computes it in Spark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakeprop.client.lake import Lake, local_times, storage_of
from lakeprop.client.reads import StateReader
from lakeprop.config import AppConfig
from lakeprop.consumers.fulltext_index import Bm25, Tokenizer
from lakeprop.errors import LakepropError
from lakeprop.spec import JobKey, target_table


class SearchError(LakepropError):
    """The job cannot be searched: unknown, of another type, or not built yet; or a bad query."""


@dataclass(frozen=True)
class SearchHit:
    key: dict[str, Any]
    """The document's primary key, column by column."""
    score: float


def job_options(config: AppConfig, key: JobKey, consumer_type: str) -> dict[str, Any]:
    """The consumer options of the live job ``key``, which must be of ``consumer_type``
    (read from the catalog without Spark), or SearchError."""
    info = StateReader.without_spark(config).get_job_status(key, waiting=False)
    if info is None or info.drop_at is not None:
        raise SearchError(f"no job {key}")
    consumer = info.spec["iteration"]["consumer"]
    if consumer["type"] != consumer_type:
        raise SearchError(f"job {key} is a {consumer['type']} job, not a {consumer_type}")
    options: dict[str, Any] = consumer["options"]
    return options


def table_path(config: AppConfig, database: str, table: str) -> str:
    """Where a consumer's table lives, or SearchError where only a metastore knows."""
    if config.tables.resolution != "path":
        raise SearchError(
            'searching without Spark reads tables by path (tables.resolution = "path"); '
            f"{database}.{table} is resolved by the metastore"
        )
    return f"{config.tables.warehouse.rstrip('/')}/{database}/{table}"


def search(
    config: AppConfig,
    key: JobKey,
    query: str,
    *,
    limit: int = 10,
    fields: Sequence[str] | None = None,
    params: Bm25 | None = None,
    spark: Any = None,
) -> list[SearchHit]:
    """The ``limit`` best documents of the job's index for ``query``, best first.

    With ``spark`` (a notebook's session) the index is read and ranked by Spark,
    which also finds metastore tables; without it, by delta-rs and Arrow."""
    if limit < 1:
        raise SearchError(f"limit must be at least 1, got {limit}")
    options = job_options(config, key, "fulltext_index")
    unknown = sorted(set(fields or ()) - set(options["columns"]))
    if unknown:
        raise SearchError(f"fields {unknown} are not indexed; indexed: {options['columns']}")
    terms = Tokenizer.from_options(options["tokenizer"]).terms(query)
    primary_key = list(options["primary_key"])
    if spark is not None:
        return _spark_search(spark, config, key, options, terms, limit, fields, params)
    lake = Lake(storage_of(config))
    path = table_path(config, *target_table(key, options))
    if not lake.exists(path):
        raise SearchError(f"the index of {key} is not built yet")
    if not terms:
        return []
    ranked = bm25(lake, path, primary_key, terms, fields=fields, limit=limit, params=params)
    return [SearchHit(key=dict(zip(primary_key, k, strict=True)), score=s) for k, s in ranked]


def _spark_search(
    spark: Any,
    config: AppConfig,
    key: JobKey,
    options: Mapping[str, Any],
    terms: Sequence[str],
    limit: int,
    fields: Sequence[str] | None,
    params: Bm25 | None,
) -> list[SearchHit]:
    from lakeprop.consumers.fulltext_index import bm25_search
    from lakeprop.tables.resolve import Tables

    index = Tables(spark, config.tables).handle(*target_table(key, options))
    if not index.exists():
        raise SearchError(f"the index of {key} is not built yet")
    if not terms:
        return []
    primary_key = list(options["primary_key"])
    ranked = bm25_search(
        index.load(index.reader()), primary_key, terms, fields=fields, limit=limit, params=params
    ).collect()
    return [
        SearchHit(key={c: row[c] for c in primary_key}, score=float(row["score"])) for row in ranked
    ]


def bm25(
    lake: Lake,
    path: str,
    primary_key: Sequence[str],
    terms: Sequence[str],
    *,
    fields: Sequence[str] | None = None,
    limit: int = 10,
    params: Bm25 | None = None,
) -> list[tuple[tuple[Any, ...], float]]:
    """(key, score) of the best ``limit`` documents, best first, ties by key: the
    formula of :func:`~lakeprop.consumers.fulltext_index.bm25_search`, in Arrow."""
    import pyarrow.dataset as ds

    params = params or Bm25()
    key = list(primary_key)
    where = ds.field("field").isin(list(fields)) if fields else None
    lengths = lake.read(path, [*key, "tf"], where).group_by(key).aggregate([("tf", "sum")])
    documents = lengths.num_rows
    if documents == 0:
        return []
    avgdl = sum(lengths.column("tf_sum").to_pylist()) / documents
    dl = dict(zip(_keys(lengths, key), lengths.column("tf_sum").to_pylist(), strict=True))
    hits_where = ds.field("term").isin(list(terms))
    if where is not None:
        hits_where &= where
    hits = lake.read(path, [*key, "term", "tf"], hits_where).group_by([*key, "term"])
    per_term = hits.aggregate([("tf", "sum")])
    df: dict[str, int] = {}
    for term in per_term.column("term").to_pylist():
        df[term] = df.get(term, 0) + 1
    scores: dict[tuple[Any, ...], float] = {}
    k1, b = params.k1, params.b
    for doc, term, tf in zip(
        _keys(per_term, key),
        per_term.column("term").to_pylist(),
        per_term.column("tf_sum").to_pylist(),
        strict=True,
    ):
        idf = math.log(1 + (documents - df[term] + 0.5) / (df[term] + 0.5))
        norm = k1 * (1 - b + b * dl[doc] / avgdl)
        scores[doc] = scores.get(doc, 0.0) + idf * tf * (k1 + 1) / (tf + norm)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]


def _keys(table: Any, key: Sequence[str]) -> list[tuple[Any, ...]]:
    columns = [local_times(table.column(c).to_pylist()) for c in key]
    return list(zip(*columns, strict=True))
