"""vector_index: snapshot and tails kept exact, Spark-free search equal to brute force,
re-training switches, a build cut short, bad vectors, and recall on digits."""

from __future__ import annotations

import json
import random
import shutil
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import lakeprop.consumers.vector_index.builds as vector_builds
from devkit.harness import (
    cdf_source,
    cli_settings,
    latest_version,
    running,
    wait_for_watermark,
)
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.client.lake import Lake
from lakeprop.client.reads import StateReader
from lakeprop.client.search import search as search_text
from lakeprop.client.vectors import VectorSearch, hybrid_search, reciprocal_rank_fusion
from lakeprop.config import AppConfig
from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.vector_index import VectorError, VectorIndexConsumer, ivf, live_postings
from lakeprop.consumers.vector_index.builds import BUILDS, Builds
from lakeprop.consumers.vector_index.versions import IndexTables
from lakeprop.engine.expect import quarantine
from lakeprop.errors import InvalidConsumerOptionsError
from lakeprop.spec import JobKey
from lakeprop.tables.resolve import Tables

pytestmark = pytest.mark.integration

ROWS = "id INT, emb ARRAY<FLOAT>, cat STRING"
DIM = 8


def vector(rng: random.Random, centre: int) -> list[float]:
    return [centre * 3.0 + rng.gauss(0, 1) for _ in range(DIM)]


def consumer_for(
    spark: SparkSession, config: AppConfig, table: str, options: dict[str, Any], job_id: int = 7
) -> VectorIndexConsumer:
    tables = Tables(spark, config.tables)
    session = spark.newSession()
    return VectorIndexConsumer(
        ConsumerContext(
            spark=session,
            key=JobKey(1, "kb", table, "vec"),
            job_id=job_id,
            consumer_type="vector_index",
            options=VectorIndexConsumer.validate_options(options),
            source_columns=("id", "emb", "cat"),
            locate=lambda d, t: tables.handle(d, t, session),
            cancelled=lambda: False,
        )
    )


def searcher(config: AppConfig, table: str, options: dict[str, Any]) -> VectorSearch:
    base = f"{config.tables.warehouse}/kb/{table}_vec"
    from lakeprop.client.vectors import IndexLocation

    return VectorSearch(
        IndexLocation(base, f"{base}__index", f"{base}__centroids"),
        VectorIndexConsumer.validate_options(options),
        Lake(),
    )


def changes(spark: SparkSession, path: str, start: int, end: int) -> DataFrame:
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(path)
    )


def postings(spark: SparkSession, config: AppConfig, table: str) -> DataFrame:
    base = f"{config.tables.warehouse}/kb/{table}_vec"
    read = spark.read.format("delta")
    live = live_postings(read.load(base), read.load(f"{base}__index"), "emb")
    assert live is not None
    return live


def assert_index_holds(
    spark: SparkSession,
    config: AppConfig,
    table: str,
    source: DataFrame,
    columns: Sequence[str] = ("id", "emb", "cat"),
) -> None:
    """The live version's postings are the source's non-NULL vectors, each in the list
    of its nearest live centroid."""
    live = postings(spark, config, table)
    assert_df_equality(
        live.select(*columns),
        source.where("emb IS NOT NULL").select(*columns),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    base = f"{config.tables.warehouse}/kb/{table}_vec"
    number = live.select("index_version").first()
    if number is None:
        return
    centroids = np.asarray(
        [
            r["centroid"]
            for r in spark.read.format("delta")
            .load(f"{base}__centroids")
            .where(F.col("index_version") == number[0])
            .orderBy("list_id")
            .collect()
        ],
        dtype=np.float32,
    )
    rows = live.select("emb", "list_id").collect()
    got = [r["list_id"] for r in rows]
    want = ivf.assign(np.asarray([r["emb"] for r in rows], dtype=np.float32), centroids, "l2")
    assert got == [int(x) for x in want]


def brute_force(
    source: DataFrame, query: Sequence[float], k: int, where: str | None = None
) -> list[int]:
    rows = (source.where(where) if where else source).where("emb IS NOT NULL").collect()
    base = np.asarray([r["emb"] for r in rows], dtype=np.float32)
    found, _ = ivf.top_k(np.asarray(query, dtype=np.float32), base, "l2", k)
    return [rows[i]["id"] for i in found]


def test_snapshot_tails_replays_and_search_equal_brute_force(
    spark: SparkSession, app_config: AppConfig
) -> None:
    rng = random.Random(5)
    path = cdf_source(spark, app_config, "kb", "docs", ROWS)
    first = [(i, vector(rng, i % 6), "ab"[i % 2]) for i in range(600)]
    spark.createDataFrame(first, ROWS).write.format("delta").mode("append").save(path)  # v1
    options = {"key": ["id"], "vector": "emb", "lists": 8, "include": ["cat"]}
    consumer = consumer_for(spark, app_config, "docs", options)
    assert consumer.snapshot(spark.read.format("delta").load(path), 1) == 600
    assert_index_holds(spark, app_config, "docs", spark.read.format("delta").load(path))

    table = DeltaTable.forPath(spark, path)
    table.update(F.col("id") < 50, {"emb": F.transform("emb", lambda x: x + 9.0)})  # v2
    table.delete(F.col("id").between(100, 129))  # v3
    fresh = [(1000 + i, vector(rng, i % 6), "b") for i in range(40)] + [(2000, None, "a")]
    spark.createDataFrame(fresh, ROWS).write.format("delta").mode("append").save(path)  # v4
    table.update(F.col("id") == 5, {"emb": F.lit(None)})  # v5: no longer indexed
    at = latest_version(spark, path)
    assert consumer.apply_changes(changes(spark, path, 2, at), 1, at) == 50 + 30 + 41
    assert consumer.apply_changes(changes(spark, path, 2, at), 1, at) == 0  # a replay
    source = spark.read.format("delta").load(path)
    assert_index_holds(spark, app_config, "docs", source)

    search = searcher(app_config, "docs", options)
    for query in [vector(rng, c) for c in (0, 3, 5)] + [[9.5] * DIM]:
        hits = search.search(query, k=10, nprobe=8)
        assert [h.key["id"] for h in hits] == brute_force(source, query, 10)
        filtered = search.search(query, k=10, nprobe=8, filter={"cat": "b"})
        assert [h.key["id"] for h in filtered] == brute_force(source, query, 10, "cat = 'b'")
        assert all(h.columns == {"cat": "b"} for h in filtered)
    gone = {
        r["id"]
        for r in spark.read.format("delta")
        .option("versionAsOf", 1)
        .load(path)
        .where("id BETWEEN 100 AND 129 OR id = 5")
        .collect()
    }
    near_gone = search.search(first[100][1], k=50, nprobe=8)
    assert not gone & {h.key["id"] for h in near_gone}


def test_a_selective_filter_probes_more_lists(spark: SparkSession, app_config: AppConfig) -> None:
    rng = random.Random(8)
    path = cdf_source(spark, app_config, "kb", "sel", ROWS)
    rows = [(i, vector(rng, i % 8), "rare" if i % 97 == 0 else "common") for i in range(800)]
    spark.createDataFrame(rows, ROWS).write.format("delta").mode("append").save(path)
    options = {"key": ["id"], "vector": "emb", "lists": 8, "nprobe": 1, "include": ["cat"]}
    consumer_for(spark, app_config, "sel", options).snapshot(
        spark.read.format("delta").load(path), 1
    )
    search = searcher(app_config, "sel", options)
    hits = search.search(vector(rng, 0), k=5, filter={"cat": ["rare"]}, max_nprobe=8)
    assert len(hits) == 5 and all(h.columns["cat"] == "rare" for h in hits)
    assert len(search.search(vector(rng, 0), k=5, filter={"cat": "rare"}, max_nprobe=1)) < 5


RETRAINING = {
    "key": ["id"],
    "vector": "emb",
    "lists": 4,
    "retrain": {"max_changed_share": 0.2, "recall_check_every": 0},
}
"""An index of four lists, re-trained once a fifth of its vectors changed."""


class Drifting:
    """A source of 400 vectors (version 1) indexed with :data:`RETRAINING`."""

    def __init__(self, spark: SparkSession, config: AppConfig, name: str, seed: int) -> None:
        rng = random.Random(seed)
        self.spark, self.config, self.name = spark, config, name
        self.path = cdf_source(spark, config, "kb", name, ROWS)
        rows = [(i, vector(rng, i % 4), "a") for i in range(400)]
        spark.createDataFrame(rows, ROWS).write.format("delta").mode("append").save(self.path)
        self.table = DeltaTable.forPath(spark, self.path)
        self.index = f"{config.tables.warehouse}/kb/{name}_vec__index"

    def consumer(self) -> VectorIndexConsumer:
        return consumer_for(self.spark, self.config, self.name, RETRAINING)

    def source(self) -> DataFrame:
        return self.spark.read.format("delta").load(self.path)

    def live(self) -> int:
        found = self.spark.read.format("delta").load(self.index).where("live").first()
        return int(found["index_version"])

    def tail(self, consumer: VectorIndexConsumer, start: int) -> int:
        """Apply the source's versions from ``start`` to its latest."""
        at = latest_version(self.spark, self.path)
        return consumer.apply_changes(changes(self.spark, self.path, start, at), start - 1, at)


def test_a_build_runs_while_tails_go_on_and_a_cut_switch_loses_nothing(
    spark: SparkSession, app_config: AppConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    drift = Drifting(spark, app_config, "drift", 11)
    consumer = drift.consumer()
    consumer.snapshot(drift.source(), 1)
    index, table, live = drift.index, drift.table, drift.live

    def tail(start: int) -> int:
        return drift.tail(consumer, start)

    # a build waits at this gate, so that tails certainly run while it is under way
    gate = threading.Event()
    build = vector_builds.build_version

    def gated(writer: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("txn") is not None:  # a background build, not a snapshot
            assert gate.wait(120)
        return build(writer, *args, **kwargs)

    monkeypatch.setattr(vector_builds, "build_version", gated)
    table.update(F.col("id") < 100, {"emb": F.transform("emb", lambda x: x + 50.0)})  # v2
    assert tail(2) == 100  # a quarter changed: version 2 starts building
    assert BUILDS.get(consumer.context.txn_app_id) is not None
    table.delete(F.col("id").between(200, 209))  # v3
    table.update(F.col("id").between(300, 309), {"emb": F.transform("emb", lambda x: -x)})  # v4
    assert tail(3) == 20  # applied to version 1 while 2 is being built
    assert live() == 1
    assert_index_holds(spark, app_config, "drift", drift.source(), ("id", "emb"))
    gate.set()
    assert BUILDS.wait(timeout=120)

    # the switch is cut short: version 1 still serves, and serves everything
    def crash(self: IndexTables, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed before the switch")

    switch = IndexTables.switch
    monkeypatch.setattr(IndexTables, "switch", crash)
    table.update(F.col("id") == 5, {"emb": F.transform("emb", lambda x: x + 1.0)})  # v5
    with pytest.raises(RuntimeError):
        tail(5)
    assert live() == 1
    query = vector(random.Random(11), 1)
    assert len(searcher(app_config, "drift", RETRAINING).search(query, k=5)) == 5

    # the repeated iteration starts the build again; the next one switches to it
    monkeypatch.setattr(IndexTables, "switch", switch)
    assert tail(5) == 1
    assert BUILDS.wait(timeout=120)
    table.update(F.col("id") == 6, {"emb": F.transform("emb", lambda x: x + 1.0)})  # v6
    assert tail(6) == 1
    assert live() == 2
    versions = spark.read.format("delta").load(index).orderBy("index_version").collect()
    assert [(v["index_version"], v["live"]) for v in versions] == [(1, False), (2, True)]
    assert versions[1]["built_because"].startswith("changed 0.")
    source = drift.source()
    assert_index_holds(spark, app_config, "drift", source, ("id", "emb"))
    # the rows of the first attempt were replaced, not doubled
    everything = spark.read.format("delta").load(f"{app_config.tables.warehouse}/kb/drift_vec")
    assert everything.where("index_version = 2").count() == source.count() == 390


def as_legacy(spark: SparkSession, base: str) -> None:
    """Rewrite the live version of the index at ``base`` as indexes were written before
    the ``float32`` encoding: the vector as ``array<float>``, no ``encoding`` column."""
    read = spark.read.format("delta")
    live = live_postings(read.load(base), read.load(f"{base}__index"), "emb")
    assert live is not None
    old = live.select("index_version", "list_id", "id", "emb", "cat").localCheckpoint()
    postings = old.write.format("delta").partitionBy("index_version", "list_id")
    pointer = read.load(f"{base}__index").drop("encoding").write.format("delta")
    for table, writer in ((base, postings), (f"{base}__index", pointer)):
        writer.mode("overwrite").option("overwriteSchema", "true").save(table)


def test_an_index_of_the_array_encoding_is_searched_and_rebuilt_in_float32(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """An index written before the ``float32`` encoding serves searches and tails as
    it is; its first tail builds the next version in ``float32`` in the background,
    and the tail after switches to it."""
    drift = Drifting(spark, app_config, "legacy", 5)
    options = {**RETRAINING, "include": ["cat"], "retrain": {"enabled": False}}
    consumer = consumer_for(spark, app_config, "legacy", options)
    consumer.snapshot(drift.source(), 1)
    base = f"{app_config.tables.warehouse}/kb/legacy_vec"
    as_legacy(spark, base)
    assert [v.encoding for v in consumer.tables.versions()] == [ivf.LEGACY]
    search = searcher(app_config, "legacy", options)
    query = vector(random.Random(5), 2)
    assert [h.key["id"] for h in search.search(query, k=5, nprobe=4)] == brute_force(
        drift.source(), query, 5
    )

    drift.table.update(F.col("id") < 10, {"emb": F.transform("emb", lambda x: x + 1.0)})  # v2
    assert drift.tail(consumer, 2) == 10  # applied to the array version; a build starts
    assert_index_holds(spark, app_config, "legacy", drift.source())
    assert BUILDS.wait(timeout=120)
    drift.table.delete(F.col("id") == 20)  # v3
    assert drift.tail(consumer, 3) == 1  # the build is made equal to the live one, switched
    live = next(v for v in consumer.tables.versions() if v.live)
    assert (live.index_version, live.encoding) == (2, ivf.ENCODING)
    assert live.built_because == "its postings are in the array encoding"
    assert_index_holds(spark, app_config, "legacy", drift.source())
    for query in (vector(random.Random(6), c) for c in range(4)):
        found = [h.key["id"] for h in search.search(query, k=5, nprobe=4)]
        assert found == brute_force(drift.source(), query, 5)


def test_a_build_left_running_by_an_instance_that_lost_the_job_never_lands_on_the_live_index(
    spark: SparkSession, app_config: AppConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job moves from instance A to B and back (rebalances); B's build of version 2
    # outlives B's ownership and ends only after A switched to its own version 2.
    moved = Drifting(spark, app_config, "moved", 13)
    a, b = moved.consumer(), moved.consumer()
    a.snapshot(moved.source(), 1)
    table, live, tail = moved.table, moved.live, moved.tail

    gate, hold = threading.Event(), threading.Event()
    build = vector_builds.build_version

    def gated(writer: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("txn") is not None and hold.is_set():
            hold.clear()
            assert gate.wait(120)
        return build(writer, *args, **kwargs)

    monkeypatch.setattr(vector_builds, "build_version", gated)
    builds_a, builds_b = BUILDS, Builds()
    table.update(F.col("id") < 100, {"emb": F.transform("emb", lambda x: x + 50.0)})  # v2
    assert tail(a, 2) == 100  # A starts building version 2, and finishes
    assert builds_a.wait(timeout=120)

    monkeypatch.setattr(vector_builds, "BUILDS", builds_b)  # B owns the job now
    hold.set()
    table.delete(F.col("id").between(200, 209))  # v3
    assert tail(b, 3) == 10  # B starts a build of version 2 of its own, held here
    assert builds_b.get(b.context.txn_app_id) is not None and not builds_b.wait(timeout=0)

    monkeypatch.setattr(vector_builds, "BUILDS", builds_a)  # and A again
    table.update(F.col("id").between(300, 309), {"emb": F.transform("emb", lambda x: -x)})  # v4
    assert tail(a, 4) == 10  # A switches to its version 2
    assert live() == 2
    table.update(F.col("id") < 20, {"emb": F.transform("emb", lambda x: x + 1.0)})  # v5
    assert tail(a, 5) == 20

    gate.set()  # B's build writes its version 2 last
    assert builds_b.wait(timeout=120)
    assert_index_holds(spark, app_config, "moved", moved.source(), ("id", "emb"))


def test_bad_vectors_fail_naming_keys_or_go_to_quarantine(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "kb", "bad", ROWS)
    rows = [(1, [1.0] * DIM, "a"), (2, [1.0] * 3, "a"), (3, [float("nan")] * DIM, "a")]
    spark.createDataFrame(rows, ROWS).write.format("delta").mode("append").save(path)
    source = spark.read.format("delta").load(path)
    strict = consumer_for(spark, app_config, "bad", {"key": ["id"], "vector": "emb"})
    with pytest.raises(VectorError, match=r"cannot be indexed.*'id': 2.*dimension 3, not 8"):
        strict.snapshot(source, 1)
    lenient = consumer_for(
        spark, app_config, "bad", {"key": ["id"], "vector": "emb", "quarantine": True}, 8
    )
    assert lenient.snapshot(source, 1) == 1
    # what the engine does after the consumer's write: the rows it set aside, written
    quarantine(lenient.context, lenient.context.set_aside, snapshot=True, version=1)
    location = f"{app_config.tables.warehouse}/kb/bad_vec__quarantine"

    def assert_quarantined() -> None:
        held = spark.read.format("delta").load(location)
        assert sorted((r["id"], r["__reason"], r["__source_version"]) for r in held.collect()) == [
            (2, "dimension 3, not 8", 1),
            (3, "a NaN, infinite or NULL element", 1),
        ]

    assert_quarantined()
    # a crash after the index switched and before the quarantine was written: the
    # replayed snapshot finds the index built, and sets the rows aside all the same
    shutil.rmtree(location)
    replayed = consumer_for(
        spark, app_config, "bad", {"key": ["id"], "vector": "emb", "quarantine": True}, 8
    )
    assert replayed.snapshot(source, 1) == 1
    quarantine(replayed.context, replayed.context.set_aside, snapshot=True, version=1)
    assert_quarantined()
    with pytest.raises(InvalidConsumerOptionsError, match="must be array<float> or array<double>"):
        VectorIndexConsumer.check_source(
            VectorIndexConsumer.validate_options({"key": ["id"], "vector": "cat"}),
            source.schema,
            spark,
        )


NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def test_the_service_keeps_a_digits_index_and_search_fuses_with_text(
    spark: SparkSession, app_config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    from sklearn.datasets import load_digits

    loaded = load_digits()
    digits, labels = loaded.data.astype(np.float32), loaded.target
    path = cdf_source(spark, app_config, "kb", "digits", ROWS)

    def rows(ids: range) -> DataFrame:
        return spark.createDataFrame(
            [(i, digits[i].tolist(), f"digit {NAMES[labels[i]]}") for i in ids], ROWS
        )

    half = len(digits) // 2
    rows(range(half)).write.format("delta").mode("append").save(path)
    key, text = JobKey(1, "kb", "digits", "vec"), JobKey(1, "kb", "digits", "text")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    for job, consumer in (
        (key, {"type": "vector_index", "options": {"key": ["id"], "vector": "emb", "lists": 32}}),
        (text, {"type": "fulltext_index", "options": {"columns": ["cat"], "primary_key": ["id"]}}),
    ):
        client.register_job(job, {"iteration": {"consumer": consumer}})
    with running(spark, app_config):
        wait_for_watermark(spark, app_config, key, latest_version(spark, path))
        rows(range(half, len(digits))).write.format("delta").mode("append").save(path)
        for job in (key, text):
            wait_for_watermark(spark, app_config, job, latest_version(spark, path))

    # the Spark-free state reader answers as the Spark one does
    lake = StateReader.without_spark(app_config)
    assert lake.get_job_status(key) == client.get_job_status(key)
    assert lake.list_jobs() == client.list_jobs()
    assert lake.usage() == client.usage() != []
    assert lake.accounts() == client.accounts()
    assert lake.source_version("kb", "digits") == latest_version(spark, path)

    # recall@10 at the default nprobe (sqrt(32) = 6 of 32 lists), against exact search
    search = VectorSearch.for_job(app_config, key)
    assert search.live()[1]["nprobe"] == 6
    found = 0
    queries = range(0, len(digits), 9)
    for q in queries:
        exact, _ = ivf.top_k(digits[q], digits, "l2", 10)
        hits = search.search(digits[q].tolist(), k=10)
        found += len({int(i) for i in exact} & {h.key["id"] for h in hits})
    assert found / (10 * len(queries)) >= 0.95

    # hybrid: BM25 and k-NN rankings fused by reciprocal rank fusion
    query = digits[7].tolist()  # a seven
    fused = hybrid_search(app_config, text, key, "seven", query, k=5)
    text_ranking = [(h.key["id"],) for h in search_text(app_config, text, "seven", limit=50)]
    vector_ranking = [(h.key["id"],) for h in search.search(query, k=50)]
    assert [(h.key["id"], h.score) for h in fused] == [
        (doc[0], score)
        for doc, score in reciprocal_rank_fusion([text_ranking, vector_ranking], limit=5)
    ]
    assert all(labels[h.key["id"]] == 7 for h in fused)

    where = ["--account", "1", "--database", "kb", "--table", "digits"]
    capsys.readouterr()
    vector_flag = ["--vector", json.dumps(query)]
    assert (
        cli.main(
            [
                *cli_settings(app_config),
                "vector-search",
                *where,
                "--name",
                "vec",
                *vector_flag,
                "-k",
                "3",
            ]
        )
        == 0
    )
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["key"] for p in printed] == [h.key for h in search.search(query, k=3)]
    assert (
        cli.main(
            [
                *cli_settings(app_config),
                "hybrid-search",
                *where,
                "--text-job",
                "text",
                "--vector-job",
                "vec",
                "seven",
                *vector_flag,
                "-k",
                "5",
            ]
        )
        == 0
    )
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["key"] for p in printed] == [h.key for h in fused]
    assert (
        cli.main(
            [*cli_settings(app_config), "vector-search", *where, "--name", "text", *vector_flag]
        )
        == 1
    )
    assert "not a vector_index" in capsys.readouterr().err
