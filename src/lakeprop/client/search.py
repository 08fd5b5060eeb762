"""Search a ``fulltext_index`` job's index: the query is tokenized as the job's
tokenizer indexes, and matching documents are ranked with BM25.

    from lakeprop.client.search import search
    for hit in search(spark, config, JobKey(0, "kb", "articles", "text"), "delta merge"):
        print(hit.score, hit.key)

The CLI does the same: ``lakeprop search --database kb --table articles --name text
"delta merge"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.consumers.fulltext_index import Bm25, Tokenizer, bm25_search
from lakeprop.errors import LakepropError
from lakeprop.spec import JobKey, target_table
from lakeprop.tables.resolve import Tables


class SearchError(LakepropError):
    """The job cannot be searched: unknown, not a full-text index, or not built yet."""


@dataclass(frozen=True)
class SearchHit:
    key: dict[str, Any]
    """The document's primary key, column by column."""
    score: float


def search(
    spark: SparkSession,
    config: AppConfig,
    key: JobKey,
    query: str,
    *,
    limit: int = 10,
    fields: Sequence[str] | None = None,
    params: Bm25 | None = None,
) -> list[SearchHit]:
    """The ``limit`` best documents of the job's index for ``query``, best first."""
    if limit < 1:
        raise SearchError(f"limit must be at least 1, got {limit}")
    info = LakepropClient(config.kafka, config.state, spark).get_job_status(key)
    if info is None or info.drop_at is not None:
        raise SearchError(f"no job {key}")
    consumer = info.spec["iteration"]["consumer"]
    if consumer["type"] != "fulltext_index":
        raise SearchError(f"job {key} is a {consumer['type']} job, not a fulltext_index")
    options = consumer["options"]
    unknown = sorted(set(fields or ()) - set(options["columns"]))
    if unknown:
        raise SearchError(f"fields {unknown} are not indexed; indexed: {options['columns']}")
    index = Tables(spark, config.tables).handle(*target_table(key, options))
    if not index.exists():
        raise SearchError(f"the index of {key} is not built yet (job state {info.state})")
    terms = Tokenizer.from_options(options["tokenizer"]).terms(query)
    if not terms:
        return []
    primary_key = list(options["primary_key"])
    ranked = bm25_search(
        index.load(index.reader()),
        primary_key,
        terms,
        fields=fields,
        limit=limit,
        params=params,
    ).collect()
    return [
        SearchHit(key={c: row[c] for c in primary_key}, score=float(row["score"])) for row in ranked
    ]
