"""vector_index's pure parts: IVF arithmetic, drift and the re-training policy,
options, search filters and reciprocal rank fusion (numpy and Arrow, no Spark)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lakeprop.client.vectors import (
    Condition,
    ListCache,
    ProbedList,
    SearchError,
    filter_expression,
    parse_filter,
    reciprocal_rank_fusion,
)
from lakeprop.consumers.vector_index import ivf
from lakeprop.consumers.vector_index.options import RetrainPolicy, VectorOptions, validate
from lakeprop.errors import InvalidConsumerOptionsError, PermanentError


def blobs(per: int = 50, centres: int = 4, dim: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [rng.normal(10.0 * c, 0.5, size=(per, dim)) for c in range(centres)]
    ).astype(np.float32)


def test_assignment_picks_the_nearest_centroid_by_each_metric() -> None:
    centroids = np.asarray([[1, 0], [0, 1], [-3, 0]], dtype=np.float32)
    vectors = np.asarray([[0.9, 0.1], [0.2, 3.0], [-1.5, 0.1], [-10, 0]], dtype=np.float32)
    assert ivf.assign(vectors, centroids, "l2").tolist() == [0, 1, 2, 2]
    # inner product: the largest dot wins, however far away
    assert ivf.assign(vectors, centroids, "inner_product").tolist() == [0, 1, 2, 2]
    assert ivf.assign(np.asarray([[5, 0.1]], np.float32), centroids, "inner_product").tolist() == [
        2 - 2
    ]
    units = ivf.unit(np.asarray([[3, 4], [0, 0]], dtype=np.float32))
    assert units.tolist() == [[0.6000000238418579, 0.800000011920929], [0, 0]]


def test_distances_and_top_k_are_stable() -> None:
    base = np.asarray([[0, 0], [3, 4], [0, 0], [1, 0]], dtype=np.float32)
    rows, found = ivf.top_k(np.asarray([0, 0], np.float32), base, "l2", 3)
    assert rows.tolist() == [0, 2, 3] and found.tolist() == [0, 0, 1]
    rows, _ = ivf.top_k(np.asarray([0, 0], np.float32), base[:0], "l2", 3)
    assert rows.tolist() == []
    cos = ivf.distances(ivf.unit(np.asarray([[1, 0]], np.float32)), ivf.unit(base[1:2]), "cosine")
    assert cos[0, 0] == pytest.approx(0.4)


def test_training_finds_separated_clusters_and_no_list_is_left_empty() -> None:
    data = blobs()
    centroids = ivf.train(data, 4, "l2", seed=3)
    lists = ivf.assign(data, centroids, "l2")
    assert sorted(np.bincount(lists, minlength=4).tolist()) == [50, 50, 50, 50]
    assert len(ivf.train(data[:3], 8, "l2")) == 3  # never more lists than vectors
    spherical = ivf.train(data + 1, 4, "cosine")
    assert np.allclose(np.linalg.norm(spherical, axis=1), 1, atol=1e-5)
    with pytest.raises(PermanentError, match="no vectors"):
        ivf.train(data[:0], 4, "l2")


def test_nearest_lists_and_sampled_recall() -> None:
    data = blobs()
    centroids = ivf.train(data, 4, "l2", seed=1)
    lists = ivf.assign(data, centroids, "l2")
    first = ivf.nearest_lists(data[0], centroids, "l2", 2)
    assert first[0] == lists[0] and len(first) == 2
    assert ivf.sampled_recall(data, lists, centroids, "l2", 4) == 1.0
    assert ivf.sampled_recall(data, lists, centroids, "l2", 1) == 1.0  # blobs: 10 in own list
    mixed = np.roll(lists, 25)  # a quarter of each list's members are another blob's
    assert ivf.sampled_recall(data, mixed, centroids, "l2", 1) < 0.9


def test_the_float32_encoding_round_trips_and_reads_as_a_view() -> None:
    vectors = blobs(per=5, centres=2, dim=3)
    column = pa.array([*vectors.tolist(), None], pa.list_(pa.float64()))
    stored = ivf.to_bytes(column)
    assert stored.type == pa.binary() and stored.null_count == 1
    assert stored[0].as_py() == vectors[0].astype("<f4").tobytes()
    present = stored.slice(2, 6)  # an offset into the buffers, as a file's slice has
    read = ivf.from_bytes(present, 3)
    assert np.array_equal(read, vectors[2:8]) and not read.flags.owndata
    assert np.array_equal(
        ivf.stored_vectors(pa.chunked_array([stored[:10]]), 3, "float32"), vectors
    )
    assert np.array_equal(ivf.stored_vectors(column[:10], 3, "array"), vectors)
    with pytest.raises(PermanentError, match="not all 4 float32"):
        ivf.from_bytes(stored[:10], 4)
    # Spark reads go through the decoder: the bytes back as a list column in their place
    batch = pa.RecordBatch.from_arrays([pa.array(range(11)), stored], names=["id", ivf.BYTES])
    (decoded,) = ivf.decoder("emb", 3)(iter([batch]))
    assert decoded.schema.names == ["id", "emb"]
    assert decoded.column(1).to_pylist() == [
        *column[:10].cast(pa.list_(pa.float32())).to_pylist(),
        None,
    ]


def test_the_list_cache_keeps_the_recent_lists_within_its_bytes() -> None:
    def probed(rows: int) -> ProbedList:
        return ProbedList(pa.table({"id": list(range(rows))}), np.zeros((rows, 4), np.float32))

    size = probed(10).nbytes
    cache = ListCache(capacity=2 * size)
    cache.put(("a.parquet",), probed(10))
    cache.put(("b.parquet",), probed(10))
    assert cache.get(("a.parquet",)) is not None  # a is now the most recent
    cache.put(("c.parquet",), probed(10))  # b goes
    assert cache.get(("b.parquet",)) is None and cache.get(("c.parquet",)) is not None
    assert cache.used == 2 * size and (cache.hits, cache.misses) == (2, 1)
    cache.put(("huge.parquet",), probed(1000))  # larger than the cache: not kept
    assert cache.get(("huge.parquet",)) is None and cache.used == 2 * size


def test_default_shape() -> None:
    assert [ivf.default_lists(n) for n in (0, 1797, 100_000, 1_000_000, 4_000_000)] == [
        1,
        2,
        100,
        1000,
        2000,
    ]
    assert [ivf.default_nprobe(n) for n in (1, 2, 100, 316, 1000)] == [1, 2, 10, 18, 32]


def test_drift_measures_and_the_policy() -> None:
    measured = ivf.drift({0: 10, 1: 30, 3: 0}, lists=4, changed=20, trained=40)
    assert measured == ivf.Drift(imbalance=3.0, empty_share=0.5, changed_share=0.5)
    policy = RetrainPolicy(max_imbalance=2.5, max_empty_share=0.6, max_changed_share=0.5)
    assert policy.reasons(measured) == ["imbalance 3.00 > 2.5"]
    worse = ivf.Drift(imbalance=1.0, empty_share=0.7, changed_share=0.9, recall=0.5)
    assert policy.reasons(worse) == [
        "empty lists 0.70 > 0.6",
        "changed 0.90 > 0.5",
        "recall 0.500 < 0.9",
    ]
    assert RetrainPolicy(enabled=False).reasons(worse) == []
    assert [RetrainPolicy(recall_check_every=3).check_recall(i) for i in range(4)] == [
        True,
        False,
        False,
        True,
    ]
    assert not RetrainPolicy(recall_check_every=0).check_recall(0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vector": "v"}, "key is required"),
        ({"key": ["id"]}, "vector is required"),
        ({"key": ["id"], "vector": "v", "metric": "hamming"}, "metric must be one of"),
        ({"key": ["id"], "vector": "v", "lists": 0}, "lists must be a positive integer"),
        ({"key": ["id"], "vector": "v", "lists": 4, "nprobe": 8}, r"nprobe \(8\) must not"),
        ({"key": ["id"], "vector": "id"}, "is a key column"),
        ({"key": ["id"], "vector": "v", "include": ["v"]}, "repeats the key or vector"),
        ({"key": ["list_id"], "vector": "v"}, "clash with the index's own columns"),
        ({"key": ["id"], "vector": "v", "retrain": {"max_imbalance": "x"}}, "must be float"),
        ({"key": ["id"], "vector": "v", "retrain": {"often": 1}}, "unknown option"),
        ({"key": ["id"], "vector": "v", "size": 3}, "unknown option"),
        ({"key": ["id"], "vector": "v; DROP"}, "vector"),
    ],
)
def test_options_are_rejected_with_their_reason(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConsumerOptionsError, match=message):
        validate(options)


def test_options_normalise() -> None:
    options = validate(
        {"key": ["id"], "vector": "v", "include": ["cat"], "retrain": {"min_recall": 1}}
    )
    parsed = VectorOptions.of(options)
    assert parsed.columns == ["id", "v", "cat"]
    assert parsed.metric == "l2" and parsed.retrain.min_recall == 1


def test_filters_parse_and_apply_to_arrow() -> None:
    conditions = parse_filter(
        {"Cat": ["a", "b"], "price": {">=": 2, "<": 4}, "lang": "en"}, ["cat", "price", "lang"]
    )
    assert conditions == [
        Condition("cat", "in", ["a", "b"]),
        Condition("price", ">=", 2),
        Condition("price", "<", 4),
        Condition("lang", "=", "en"),
    ]
    table = pa.table(
        {
            "cat": ["a", "b", "c", "a"],
            "price": [2, 3, 3, 4],
            "lang": ["en", "en", "en", "de"],
        }
    )
    kept = table.filter(filter_expression(conditions))
    assert kept.to_pylist() == [
        {"cat": "a", "price": 2, "lang": "en"},
        {"cat": "b", "price": 3, "lang": "en"},
    ]
    assert filter_expression([]) is None
    with pytest.raises(SearchError, match="'title' is not included"):
        parse_filter({"title": "x"}, ["cat"])
    with pytest.raises(SearchError, match="operators must be among"):
        parse_filter({"cat": {"~": "x"}}, ["cat"])


def test_reciprocal_rank_fusion() -> None:
    text = [("a",), ("b",), ("c",)]
    vectors = [("c",), ("a",), ("d",)]
    fused = reciprocal_rank_fusion([text, vectors], limit=3)
    assert [key for key, _ in fused] == [("a",), ("c",), ("b",)]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert fused[1][1] == pytest.approx(1 / 63 + 1 / 61)
    # ties rank by key
    assert [k for k, _ in reciprocal_rank_fusion([[("y",)], [("x",)]])] == [("x",), ("y",)]
