"""fulltext_index: exact postings under a random workload, replay safety, BM25 ranking."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.harness import (
    cdf_source,
    cli_settings,
    latest_version,
    running,
    ticks_pass,
    wait_for_watermark,
)
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.client.search import SearchError, SearchHit, search
from lakeprop.config import AppConfig
from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.fulltext_index import FulltextIndexConsumer, Tokenizer
from lakeprop.spec import JobKey
from lakeprop.tables.resolve import Tables

pytestmark = pytest.mark.integration

DOCS = "id INT, title STRING, body STRING"
INDEX = "term STRING, id INT, field STRING, tf INT, positions ARRAY<INT>"
WORDS = ["Delta", "lake", "the", "AND", "merge", "café", "naïve", "Straße", "x", "of", "log"]


def expected_index(spark: SparkSession, rows: DataFrame, options: dict[str, Any]) -> DataFrame:
    """The index computed from scratch, in Python, from the source rows."""
    tokenizer = Tokenizer.from_options(options["tokenizer"])
    postings: dict[tuple[str, int, str], list[int]] = {}
    for row in rows.collect():
        for field in options["columns"]:
            for position, term in tokenizer.tokens(row[field]):
                postings.setdefault((term, row["id"], field), []).append(position)
    return spark.createDataFrame(
        [(t, i, f, len(p), sorted(p)) for (t, i, f), p in postings.items()], INDEX
    )


def index_at(spark: SparkSession, config: AppConfig, table: str) -> DataFrame:
    return spark.read.format("delta").load(f"{config.tables.warehouse}/kb/{table}")


def text(rng: random.Random) -> str | None:
    if rng.random() < 0.1:
        return None
    separators = [" ", ", ", "-", "_", "  ", "! "]
    return "".join(
        rng.choice(WORDS) + rng.choice(separators) for _ in range(rng.randint(0, 7))
    ).strip()


def random_text_commits(
    spark: SparkSession, path: str, rng: random.Random, live: set[int], commits: int
) -> None:
    table = DeltaTable.forPath(spark, path)
    for _ in range(commits):
        op = rng.choice(["insert", "update", "update", "delete"]) if live else "insert"
        if op == "insert":
            ids = [max(live | {0}) + i + 1 for i in range(rng.randint(1, 5))]
            rows = [(i, text(rng), text(rng)) for i in ids]
            spark.createDataFrame(rows, DOCS).write.format("delta").mode("append").save(path)
            live.update(ids)
        elif op == "update":
            for i in rng.sample(sorted(live), k=min(len(live), rng.randint(1, 3))):
                column = rng.choice(["title", "body"])
                table.update(F.col("id") == i, {column: F.lit(text(rng))})
        else:
            ids = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 2)))
            table.delete(F.col("id").isin(ids))
            live.difference_update(ids)


def fulltext_job(options: dict[str, Any], trigger: str = "default") -> dict[str, Any]:
    return {
        "trigger": {"kind": trigger},
        "iteration": {"consumer": {"type": "fulltext_index", "options": options}},
    }


@pytest.mark.parametrize("seed", [3])
def test_the_index_follows_a_random_workload_exactly(
    spark: SparkSession, app_config: AppConfig, seed: int
) -> None:
    rng = random.Random(seed)
    path = cdf_source(spark, app_config, "kb", "docs", DOCS)
    live: set[int] = set()
    random_text_commits(spark, path, rng, live, 4)
    options = {
        "plain": FulltextIndexConsumer.validate_options(
            {"columns": ["title", "body"], "primary_key": ["id"]}
        ),
        "strict": FulltextIndexConsumer.validate_options(
            {
                "columns": ["body"],
                "primary_key": ["id"],
                "tokenizer": {
                    "lowercase": False,
                    "pattern": r"[\s,!]+",
                    "stop_words": ["lake", "x"],
                    "min_length": 2,
                },
            }
        ),
    }
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    keys = {name: JobKey(1, "kb", "docs", name) for name in options}
    for name, opts in options.items():
        client.register_job(keys[name], fulltext_job(opts))

    with running(spark, app_config) as app:
        for _ in range(3):  # several commits per tick, and across ticks
            random_text_commits(spark, path, rng, live, 4)
            ticks_pass(app, 1)  # the next burst lands in a later tick
        latest = latest_version(spark, path)
        for key in keys.values():
            wait_for_watermark(spark, app_config, key, latest)

    source = spark.read.format("delta").option("versionAsOf", latest).load(path)
    for name, opts in options.items():
        assert_df_equality(
            index_at(spark, app_config, f"docs_{name}"),
            expected_index(spark, source, opts),
            ignore_row_order=True,
            ignore_nullable=True,
        )


def test_a_replayed_index_write_changes_nothing(spark: SparkSession, app_config: AppConfig) -> None:
    path = cdf_source(spark, app_config, "kb", "rep", DOCS)
    rows = [(1, "Delta lake", "merge the log"), (2, "café", None), (3, "x", "Delta")]
    spark.createDataFrame(rows, DOCS).write.format("delta").mode("append").save(path)  # v1
    table = DeltaTable.forPath(spark, path)
    table.update("id = 1", {"body": "'merge merge'"})  # v2: "the" and "log" go
    table.delete("id = 2")  # v3
    tables = Tables(spark, app_config.tables)
    session = spark.newSession()
    options = FulltextIndexConsumer.validate_options(
        {"columns": ["title", "body"], "primary_key": ["id"]}
    )
    consumer = FulltextIndexConsumer(
        ConsumerContext(
            spark=session,
            key=JobKey(1, "kb", "rep", "text"),
            job_id=7,
            consumer_type="fulltext_index",
            options=options,
            source_columns=("id", "title", "body"),
            locate=lambda d, t: tables.handle(d, t, session),
            cancelled=lambda: False,
        )
    )
    target = f"{app_config.tables.warehouse}/kb/rep_text"
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 2)
        .option("endingVersion", 3)
        .load(path)
    )
    at = spark.read.format("delta").option("versionAsOf", 1).load(path)

    assert consumer.snapshot(at, 1) == 7
    assert consumer.snapshot(at, 1) == 7  # skipped by Delta: same transaction version
    assert latest_version(spark, target) == 0
    # id 1 is rebuilt: delta, lake, merge (tf 2) upserted, log removed ("the" is a stop
    # word); id 2 is deleted: café removed. 5 postings written.
    assert consumer.apply_changes(changes, 1, 3) == 5
    # replayed after a "crash": the stale postings are gone already, only the 3 fresh remain
    assert consumer.apply_changes(changes, 1, 3) == 3
    assert latest_version(spark, target) == 1  # one MERGE committed
    assert_df_equality(
        spark.read.format("delta").load(target),
        expected_index(spark, spark.read.format("delta").load(path), options),
        ignore_row_order=True,
        ignore_nullable=True,
    )


CORPUS = [
    (1, "The quick brown fox", None),
    (2, "Quick, quick!", "fox jumps"),
    (3, "Lazy", "dog"),
    (4, None, "the fox and the dog"),
]


def test_bm25_ranks_a_hand_checked_corpus(
    spark: SparkSession,
    app_config: AppConfig,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = cdf_source(spark, app_config, "kb", "corpus", DOCS)
    spark.createDataFrame(CORPUS, DOCS).write.format("delta").mode("append").save(path)
    key = JobKey(0, "kb", "corpus", "text")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    client.register_job(key, fulltext_job({"columns": ["title", "body"], "primary_key": ["id"]}))
    client.register_job(
        JobKey(0, "kb", "corpus", "copy"),
        {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}},
    )
    with running(spark, app_config):
        wait_for_watermark(spark, app_config, key, latest_version(spark, path))

    # After stop words: d1 quick brown fox (dl 3), d2 quick quick | fox jumps (4),
    # d3 lazy | dog (2), d4 fox dog (2). N = 4, avgdl = 11 / 4 = 2.75.
    # idf(quick; df 2) = ln(1 + 2.5 / 2.5) = 0.693147, idf(fox; df 3) = ln(1 + 1.5 / 3.5) = 0.356675
    # d2: 0.693147 * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 4 / 2.75))
    #   + 0.356675 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / 2.75))    = 1.145796
    # d1: (0.693147 + 0.356675) * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 3 / 2.75)) = 1.012179
    # d4: 0.356675 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / 2.75))  = 0.401467
    hits = search(app_config, key, "Quick FOX, the")
    assert [h.key for h in hits] == [{"id": 2}, {"id": 1}, {"id": 4}]
    assert [h.score for h in hits] == pytest.approx([1.145796, 1.012179, 0.401467], abs=1e-6)
    # a notebook's Spark session ranks the same (Spark reads, Spark ranks)
    on_spark = search(app_config, key, "Quick FOX, the", spark=spark)
    assert [h.key for h in on_spark] == [h.key for h in hits]
    assert [h.score for h in on_spark] == pytest.approx([h.score for h in hits], abs=1e-9)

    # equal scores rank by key; limit cuts the list
    assert search(app_config, key, "dog", limit=1) == [
        SearchHit({"id": 3}, pytest.approx(0.780194, abs=1e-6))
    ]
    # one field only: body holds d2 fox jumps, d3 dog, d4 fox dog: N = 3, avgdl = 5 / 3,
    # idf(fox; df 2) = ln(1 + 1.5 / 2.5) = 0.470004; d2 = d4 = 0.470004 * 2.2 / (1 + 1.2 * 1)
    body = search(app_config, key, "fox", fields=["body"])
    assert [(h.key["id"], round(h.score, 6)) for h in body] == [(2, 0.434457), (4, 0.434457)]
    assert search(app_config, key, "the and") == []  # only stop words
    assert search(app_config, key, "unicorn") == []

    index = index_at(spark, app_config, "corpus_text")
    assert sorted(
        (r["term"], r["id"], r["field"], r["tf"], list(r["positions"]))
        for r in index.where(F.col("term").isin("quick", "fox")).collect()
    ) == [
        ("fox", 1, "title", 1, [3]),
        ("fox", 2, "body", 1, [0]),
        ("fox", 4, "body", 1, [1]),
        ("quick", 1, "title", 1, [1]),
        ("quick", 2, "title", 2, [0, 1]),
    ]

    with pytest.raises(SearchError, match="not a fulltext_index"):
        search(app_config, JobKey(0, "kb", "corpus", "copy"), "fox")
    with pytest.raises(SearchError, match="no job"):
        search(app_config, JobKey(0, "kb", "corpus", "nope"), "fox")
    with pytest.raises(SearchError, match="not indexed"):
        search(app_config, key, "fox", fields=["author"])

    base = cli_settings(app_config)
    where = ["--database", "kb", "--table", "corpus", "--name", "text"]
    capsys.readouterr()
    assert cli.main([*base, "search", *where, "quick fox", "--limit", "2"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == [
        {"score": 1.145796, "key": {"id": 2}},
        {"score": 1.012179, "key": {"id": 1}},
    ]
