"""IVF (inverted file) arithmetic in numpy: training, assignment, ranking, drift.

Pure functions over arrays, shared by the consumer (in the driver and in
``mapInArrow`` on the executors) and by the Spark-free search. Vectors are
``float32`` rows of an ``(n, d)`` array.

Metrics, and the ``distance`` a search reports (smaller is nearer):

* ``l2``: the Euclidean distance;
* ``cosine``: ``1 - cos``; vectors are stored unit-length, so it is ``1 - x.q``;
* ``inner_product``: ``-x.q`` (the largest inner product ranks first).

A vector goes to the list of its nearest centroid by the same metric (for
``inner_product``, the centroid with the largest inner product, as faiss does).

How the postings hold a vector is the index version's ``encoding``:

* ``float32`` (written since the format was introduced): ``vector_bytes``, a
  ``binary`` column of ``4 * d`` little-endian bytes. Parquet keeps it as one
  length and the bytes per row, and a reader maps the bytes of a whole file
  into an ``(n, d)`` array without a per-element step;
* ``array`` (indexes built before): the vector column as ``array<float>``,
  whose repetition levels make reading a probed list several times slower.
  A tail that finds its live version in it builds the next version in
  ``float32`` and switches to it, as a re-training does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lakeprop.errors import ErrorCode, PermanentError

Vectors = npt.NDArray[np.float32]
METRICS = ("l2", "cosine", "inner_product")
ENCODING, LEGACY = "float32", "array"
"""The encoding new index versions are written in, and the one before it."""
BYTES = "vector_bytes"
"""The postings column of the ``float32`` encoding."""


def vector_array(vectors: Any, dimension: int) -> Vectors:
    """An Arrow list column of equal-length vectors (no NULLs) as an ``(n, d)`` array."""
    flat = vectors.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(-1, dimension)


def from_bytes(vectors: Any, dimension: int) -> Vectors:
    """An Arrow binary column of ``float32`` vectors (no NULLs) as an ``(n, d)`` array,
    a view of the column's data buffer when its rows lie back to back."""
    import pyarrow as pa

    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    width = 4 * dimension
    n = len(vectors)
    if n == 0:
        return np.empty((0, dimension), dtype=np.float32)
    _, offsets, data = vectors.buffers()
    ends = np.frombuffer(offsets, dtype=np.int32, count=n + 1, offset=4 * vectors.offset)
    start = int(ends[0])
    if int(ends[-1]) - start == n * width and bool((np.diff(ends) == width).all()):
        flat = np.frombuffer(data, dtype="<f4", count=n * dimension, offset=start)
        return flat.reshape(n, dimension)
    raise PermanentError(
        f"stored vectors are not all {dimension} float32 values ({width} bytes)",
        ErrorCode.CONSUMER_FAILED,
    )


def stored_vectors(column: Any, dimension: int, encoding: str) -> Vectors:
    """The postings' vector column of an index version of ``encoding`` (no NULLs) as
    an ``(n, d)`` array."""
    import pyarrow as pa

    whole = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return vector_array(whole, dimension) if encoding == LEGACY else from_bytes(whole, dimension)


def to_bytes(vectors: Any) -> Any:
    """An Arrow list column of ``float32``-castable vectors as a binary column of their
    little-endian bytes (NULL stays NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    values = pc.list_flatten(vectors).cast(pa.float32())
    flat = np.ascontiguousarray(values.to_numpy(zero_copy_only=False), dtype="<f4")
    sizes = pc.fill_null(pc.list_value_length(vectors), 0).to_numpy(zero_copy_only=False)
    ends = np.zeros(len(vectors) + 1, dtype=np.int32)
    ends[1:] = np.cumsum(sizes.astype(np.int64) * 4)
    validity = vectors.buffers()[0] if vectors.null_count else None
    if validity is not None and vectors.offset:
        validity = pc.is_valid(vectors).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(),
        len(vectors),
        [validity, pa.py_buffer(ends.tobytes()), pa.py_buffer(flat.tobytes())],
        null_count=vectors.null_count,
    )


def assigner(
    centroids: Vectors, metric: str, column: str, dimension: int
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function adding ``list_id`` (the nearest centroid of each
    non-NULL vector, -1 for a NULL one, a delete) and the vector's ``float32``
    bytes as :data:`BYTES`."""

    def assign_batches(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            vectors = batch.column(column)
            ids = np.full(batch.num_rows, -1, dtype=np.int32)
            valid = pc.is_valid(vectors).to_numpy(zero_copy_only=False)
            if valid.any():
                present = vector_array(vectors.filter(pa.array(valid)), dimension)
                ids[valid] = assign(present, centroids, metric) if len(centroids) else 0
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(ids, pa.int32()), to_bytes(vectors)],
                names=[*batch.schema.names, "list_id", BYTES],
            )

    return assign_batches


def decoder(column: str, dimension: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function turning :data:`BYTES` back into ``column``, a list of
    floats in its place (NULL stays NULL), for Spark's reads of ``float32`` postings."""

    def decode_batches(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            raw = batch.column(BYTES)
            valid = pc.is_valid(raw)
            present = from_bytes(raw.filter(valid), dimension)
            sizes = np.where(valid.to_numpy(zero_copy_only=False), dimension, 0)
            offsets = np.zeros(len(raw) + 1, dtype=np.int32)
            offsets[1:] = np.cumsum(sizes)
            lists = pa.ListArray.from_arrays(
                pa.array(offsets),
                pa.array(present.reshape(-1), pa.float32()),
                mask=pc.invert(valid),
            )
            names = batch.schema.names
            yield pa.RecordBatch.from_arrays(
                [lists if n == BYTES else batch.column(n) for n in names],
                names=[column if n == BYTES else n for n in names],
            )

    return decode_batches


def unit(vectors: Vectors) -> Vectors:
    """Rows scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    out: Vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return out


def distances(queries: Vectors, base: Vectors, metric: str) -> Vectors:
    """``(len(queries), len(base))`` distances, smaller is nearer (see the module)."""
    dots = queries @ base.T
    if metric == "l2":
        squares = np.einsum("ij,ij->i", base, base)  # no (n, d) temporary
        sq = np.einsum("ij,ij->i", queries, queries)[:, None] - 2 * dots + squares[None, :]
        out: Vectors = np.sqrt(np.maximum(sq, 0, out=sq)).astype(np.float32)
    elif metric == "cosine":
        out = (1 - dots).astype(np.float32)
    else:
        out = (-dots).astype(np.float32)
    return out


def assign(
    vectors: Vectors, centroids: Vectors, metric: str, chunk: int = 8192
) -> npt.NDArray[np.int32]:
    """The list (centroid row) of each vector."""
    out = np.empty(len(vectors), dtype=np.int32)
    for start in range(0, len(vectors), chunk):
        block = vectors[start : start + chunk]
        out[start : start + len(block)] = np.argmin(
            distances(block, centroids, metric), axis=1
        ).astype(np.int32)
    return out


def nearest_lists(query: Vectors, centroids: Vectors, metric: str, nprobe: int) -> list[int]:
    """The ``nprobe`` lists nearest ``query`` (one row), nearest first."""
    d = distances(query.reshape(1, -1), centroids, metric)[0]
    nprobe = min(nprobe, len(centroids))
    best = np.argpartition(d, nprobe - 1)[:nprobe]
    return [int(i) for i in best[np.argsort(d[best], kind="stable")]]


def top_k(
    query: Vectors, base: Vectors, metric: str, k: int
) -> tuple[npt.NDArray[np.int64], Vectors]:
    """Row numbers of the ``k`` nearest rows of ``base`` and their distances, nearest
    first (ties by row number, so results are stable)."""
    if len(base) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    d = distances(query.reshape(1, -1), base, metric)[0]
    k = min(k, len(base))
    best = np.argpartition(d, k - 1)[:k]
    order = np.lexsort((best, d[best]))
    rows = best[order].astype(np.int64)
    return rows, d[rows]


def default_lists(rows: int) -> int:
    """About rows/1,000 up to 1M rows, sqrt(rows) above; at least 1."""
    if rows <= 1_000_000:
        return max(1, round(rows / 1000))
    return round(math.sqrt(rows))


def default_nprobe(lists: int) -> int:
    """The default search width: sqrt(lists), at least 4 (all lists when fewer)."""
    return min(lists, max(4, round(math.sqrt(lists))))


def train(
    sample: Vectors, lists: int, metric: str, *, iterations: int = 20, seed: int = 0
) -> Vectors:
    """``lists`` centroids by Lloyd's k-means over ``sample``, in the driver.

    Starts from k-means++ seeds (:func:`seeds`); a list left empty is
    re-seeded with the sample row farthest from its centroid, so every list
    starts with members. For ``cosine`` the centroids are unit vectors
    (spherical k-means); ``l2`` and ``inner_product`` train on L2, as faiss does.
    """
    if len(sample) == 0:
        raise PermanentError("cannot train an index on no vectors", ErrorCode.CONSUMER_FAILED)
    rng = np.random.default_rng(seed)
    lists = min(lists, len(sample))
    centroids = seeds(sample, lists, rng)
    train_metric = "cosine" if metric == "cosine" else "l2"
    for _ in range(iterations):
        d = distances(sample, centroids, train_metric)
        nearest = np.argmin(d, axis=1)
        sums = np.zeros_like(centroids)
        np.add.at(sums, nearest, sample)
        counts = np.bincount(nearest, minlength=lists).astype(np.float32)
        empty = np.flatnonzero(counts == 0)
        moved: Vectors = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
        if len(empty):
            far = np.argsort(-d[np.arange(len(sample)), nearest], kind="stable")[: len(empty)]
            moved[empty] = sample[far]
        centroids = unit(moved) if metric == "cosine" else moved.astype(np.float32)
    return centroids.astype(np.float32)


def seeds(sample: Vectors, lists: int, rng: np.random.Generator) -> Vectors:
    """k-means++ seeding: each next seed is a sample row drawn with probability
    proportional to its squared distance from the seeds so far, so the seeds
    spread over the clusters instead of piling up in the dense ones."""
    chosen = [int(rng.integers(len(sample)))]
    nearest = ((sample - sample[chosen[0]]) ** 2).sum(1, dtype=np.float64)
    for _ in range(1, lists):
        total = float(nearest.sum())
        if total <= 0:  # every row sits on a seed: take unused rows
            unused = np.setdiff1d(np.arange(len(sample)), chosen)
            chosen += [int(i) for i in unused[: lists - len(chosen)]]
            break
        pick = int(rng.choice(len(sample), p=nearest / total))
        chosen.append(pick)
        np.minimum(nearest, ((sample - sample[pick]) ** 2).sum(1, dtype=np.float64), out=nearest)
    picked: Vectors = sample[chosen].copy()
    return picked


@dataclass(frozen=True)
class Drift:
    """How far an index has drifted from its training, measured at each iteration."""

    imbalance: float
    """Largest list / mean list size (1.0 is perfectly even)."""
    empty_share: float
    """Share of the lists with no vector."""
    changed_share: float
    """Vectors changed (inserted, updated, deleted) since training / vectors trained on."""
    recall: float | None = None
    """Sampled recall@10 at the default nprobe, when checked this iteration."""


def drift(list_sizes: dict[int, int], lists: int, changed: int, trained: int) -> Drift:
    """Drift measures from the list sizes (list id -> vectors) of an index of ``lists``."""
    total = sum(list_sizes.values())
    mean = total / lists if lists else 0.0
    largest = max(list_sizes.values(), default=0)
    empty = lists - sum(1 for size in list_sizes.values() if size > 0)
    return Drift(
        imbalance=largest / mean if mean else 1.0,
        empty_share=empty / lists if lists else 0.0,
        changed_share=changed / max(trained, 1),
    )


def sampled_recall(
    sample: Vectors,
    sample_lists: npt.NDArray[np.int32],
    centroids: Vectors,
    metric: str,
    nprobe: int,
    *,
    queries: int = 50,
    k: int = 10,
    seed: int = 0,
) -> float:
    """Recall@k of IVF search within a sample of the index: for ``queries`` sample
    rows, the share of their ``k`` nearest sample rows that lie in the query's
    ``nprobe`` nearest lists (so a search probing them would find them)."""
    if len(sample) <= k:
        return 1.0
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(sample), size=min(queries, len(sample)), replace=False)
    found = 0
    for q in picked:
        exact, _ = top_k(sample[q], sample, metric, k)
        probed = set(nearest_lists(sample[q], centroids, metric, nprobe))
        found += sum(int(sample_lists[i]) in probed for i in exact)
    return found / (len(picked) * k)
