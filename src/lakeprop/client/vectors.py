"""Search a ``vector_index`` job's index without Spark, and fuse it with full-text search.

    from lakeprop.client.vectors import VectorSearch
    searcher = VectorSearch.for_job(config, JobKey(0, "kb", "docs", "vectors"))
    for hit in searcher.search([0.1, 0.2, ...], k=10, filter={"lang": "en"}):
        print(hit.distance, hit.key, hit.columns)

A search follows the index's pointer (``<target>__index``) to the live
version, ranks the centroids of that version, reads the files of the
``nprobe`` nearest lists of the postings (found by their partition values in
the Delta log, kept until the pointer moves) and ranks their vectors exactly
with numpy. The lists it read stay in a small cache (:class:`ListCache`),
keyed by their files, so a warm searcher reads only the lists it has not
probed lately. A ``filter``
over included columns is applied to the probed rows; when fewer than ``k``
pass, more lists are probed (nearest first), up to ``max_nprobe``, so a
selective filter still finds ``k`` results where they exist.

A filter maps included columns to conditions, all of which must hold::

    {"lang": "en"}                      # equal
    {"lang": ["en", "de"]}              # one of
    {"price": {">=": 10, "<": 20}}      # comparisons: = != < <= > >=

:func:`reciprocal_rank_fusion` merges rankings (BM25 and vector) by
``sum 1 / (60 + rank)``; :func:`hybrid_search` does it for a full-text job
and a vector job of the same table.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lakeprop.client.lake import Lake, local_times, scan, storage_of
from lakeprop.client.search import SearchError, bm25, job_options, table_path
from lakeprop.config import AppConfig
from lakeprop.consumers.fulltext_index import Tokenizer
from lakeprop.consumers.vector_index import ivf
from lakeprop.spec import JobKey, target_table

RRF_K = 60
_OPERATORS = {"=", "!=", "<", "<=", ">", ">="}


@dataclass(frozen=True)
class VectorHit:
    key: dict[str, Any]
    """The row's key, column by column."""
    distance: float
    """Smaller is nearer: L2 distance, 1 - cosine, or -inner product."""
    columns: dict[str, Any] = field(default_factory=dict)
    """The job's included columns."""


@dataclass(frozen=True)
class Condition:
    column: str
    op: str
    value: Any


def parse_filter(value: Mapping[str, Any] | None, included: Sequence[str]) -> list[Condition]:
    """The conditions of a filter (see the module), or SearchError naming the problem."""
    if not value:
        return []
    if not isinstance(value, Mapping):
        raise SearchError("filter must be an object of column -> condition")
    known = {c.lower(): c for c in included}
    out: list[Condition] = []
    for name, condition in value.items():
        column = known.get(str(name).lower())
        if column is None:
            raise SearchError(
                f"filter column {name!r} is not included in the index; included: {list(included)}"
            )
        if isinstance(condition, Mapping):
            unknown = sorted(set(condition) - _OPERATORS)
            if unknown or not condition:
                raise SearchError(
                    f"filter on {column!r}: operators must be among {sorted(_OPERATORS)}"
                )
            out += [Condition(column, op, v) for op, v in condition.items()]
        elif isinstance(condition, list):
            out.append(Condition(column, "in", condition))
        else:
            out.append(Condition(column, "=", condition))
    return out


def filter_expression(conditions: Sequence[Condition]) -> Any:
    """The conditions as one Arrow expression (None for no filter)."""
    import pyarrow.dataset as ds

    expression = None
    for c in conditions:
        column = ds.field(c.column)
        if c.op == "in":
            term = column.isin(c.value)
        elif c.op == "=":
            term = column == c.value
        elif c.op == "!=":
            term = column != c.value
        elif c.op == "<":
            term = column < c.value
        elif c.op == "<=":
            term = column <= c.value
        elif c.op == ">":
            term = column > c.value
        else:
            term = column >= c.value
        expression = term if expression is None else expression & term
    return expression


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[tuple[Any, ...]]], k: int = RRF_K, limit: int = 10
) -> list[tuple[tuple[Any, ...], float]]:
    """Keys ranked by ``sum over rankings of 1 / (k + rank)`` (rank from 1), best
    first; ties by key, so results are stable."""
    scores: dict[tuple[Any, ...], float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]


@dataclass(frozen=True)
class IndexLocation:
    """Where a vector job's three tables live."""

    postings: str
    index: str
    centroids: str


CACHE_BYTES = 64 << 20
"""The default size of a searcher's cache of probed lists (vectors and columns)."""


@dataclass(frozen=True)
class ProbedList:
    """One list of one index version as read: its columns, and its vectors."""

    rows: Any
    """An Arrow table of the key and included columns."""
    vectors: ivf.Vectors

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes) + int(self.vectors.nbytes)


class ListCache:
    """Probed lists, least recently used first out past ``capacity`` bytes. A list is
    keyed by the Parquet files that hold it: Delta files never change, so an entry
    is valid as long as a version of the table still names those files, and a
    list rewritten by a tail or a new version is a new key."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._lists: OrderedDict[tuple[str, ...], ProbedList] = OrderedDict()

    def get(self, files: tuple[str, ...]) -> ProbedList | None:
        found = self._lists.get(files)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._lists.move_to_end(files)
        return found

    def put(self, files: tuple[str, ...], probed: ProbedList) -> None:
        if probed.nbytes > self.capacity or files in self._lists:
            return
        self._lists[files] = probed
        self.used += probed.nbytes
        while self.used > self.capacity:
            _, old = self._lists.popitem(last=False)
            self.used -= old.nbytes


@dataclass(frozen=True)
class _Layout:
    """The postings table as of one pointer version: its Arrow dataset, and the
    files of each (index version, list)."""

    dataset: Any
    files: dict[tuple[int, int], list[Any]]

    @classmethod
    def of(cls, dataset: Any) -> _Layout:
        import pyarrow.dataset as ds

        files: dict[tuple[int, int], list[Any]] = {}
        for fragment in dataset.get_fragments():
            keys = ds.get_partition_keys(fragment.partition_expression)
            files.setdefault((int(keys["index_version"]), int(keys["list_id"])), []).append(
                fragment
            )
        return cls(dataset, files)

    def fragments(self, number: int, list_id: int) -> list[Any]:
        return self.files.get((number, list_id), [])


class VectorSearch:
    """Searches one ``vector_index`` job's index; keep it to search again warm.

    It keeps the lists it probed in a cache of ``cache_bytes`` (see
    :class:`ListCache`); 0 turns it off."""

    def __init__(
        self,
        location: IndexLocation,
        options: Mapping[str, Any],
        lake: Lake,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self.location = location
        self.key_columns: list[str] = list(options["key"])
        self.vector: str = options["vector"]
        self.include: list[str] = list(options.get("include") or [])
        self.lake = lake
        self.cache = ListCache(cache_bytes)
        self._live: tuple[int, dict[str, Any], ivf.Vectors] | None = None
        self._pointer_version: int | None = None
        self._layout_at: tuple[int | None, _Layout] | None = None

    @classmethod
    def for_job(cls, config: AppConfig, key: JobKey) -> VectorSearch:
        """The searcher of a job, found in the catalog (without Spark)."""
        options = job_options(config, key, "vector_index")
        lake = Lake(storage_of(config))
        return cls(_location(config, key, options), options, lake)

    def live(self) -> tuple[int, dict[str, Any], ivf.Vectors]:
        """The live index version, its row of ``<target>__index`` and its centroids;
        read again only after a new commit to the pointer table."""
        import pyarrow.dataset as ds

        pointer = self.lake.open(self.location.index)
        version = pointer.version()
        if self._live is not None and version == self._pointer_version:
            return self._live
        rows = [r for r in scan(pointer.to_pyarrow_dataset(), None).to_pylist() if r["live"]]
        if not rows:
            raise SearchError(f"the index at {self.location.postings} has no live version")
        meta = rows[0]
        meta["encoding"] = meta.get("encoding") or ivf.LEGACY
        number = int(meta["index_version"])
        centroids = self.lake.read(
            self.location.centroids, ["list_id", "centroid"], ds.field("index_version") == number
        ).sort_by("list_id")
        dimension = int(meta["dimension"])
        vectors = (
            np.asarray(centroids.column("centroid").to_pylist(), dtype=np.float32).reshape(
                -1, dimension
            )
            if centroids.num_rows
            else np.empty((0, dimension), dtype=np.float32)
        )
        self._live, self._pointer_version = (number, meta, vectors), version
        return self._live

    def search(
        self,
        vector: Sequence[float],
        k: int = 10,
        nprobe: int | None = None,
        filter: Mapping[str, Any] | None = None,
        max_nprobe: int | None = None,
    ) -> list[VectorHit]:
        """The ``k`` nearest rows to ``vector``, nearest first, at one index version."""
        if k < 1:
            raise SearchError(f"k must be at least 1, got {k}")
        _, meta, centroids = self.live()
        query = np.asarray(vector, dtype=np.float32)
        if query.ndim != 1 or len(query) != int(meta["dimension"]) or not np.isfinite(query).all():
            raise SearchError(
                f"the query must be {meta['dimension']} finite numbers, got {len(query)}"
            )
        metric = str(meta["metric"])
        if metric == "cosine":
            query = ivf.unit(query.reshape(1, -1))[0]
        lists = max(len(centroids), 1)
        width = min(nprobe or int(meta["nprobe"]), lists)
        bound = min(max_nprobe or 4 * width, lists)
        conditions = filter_expression(parse_filter(filter, self.include))
        order = ivf.nearest_lists(query, centroids, metric, lists) if len(centroids) else [0]
        probed = self._probe(meta, order[:width], conditions)
        while conditions is not None and sum(len(p.vectors) for p in probed) < k and width < bound:
            wider = min(bound, width * 2)
            probed += self._probe(meta, order[width:wider], conditions)
            width = wider
        return self._ranked(probed, query, metric, k)

    def _probe(
        self, meta: Mapping[str, Any], lists: Sequence[int], conditions: Any
    ) -> list[ProbedList]:
        """The rows of ``lists`` that pass ``conditions``, list by list, from the cache
        or read (the lists not cached in one scan)."""
        layout, number = self._layout(), int(meta["index_version"])
        keys = {i: tuple(sorted(f.path for f in layout.fragments(number, i))) for i in lists}
        found = {i: self.cache.get(keys[i]) for i in lists}
        missing = [i for i in lists if found[i] is None]
        if missing:
            read = self._read(layout, meta, missing)
            for i in missing:
                found[i] = read[i]
                self.cache.put(keys[i], read[i])
        out = [found[i] for i in lists]
        return [_filtered(p, conditions) for p in out if p is not None]

    def _read(
        self, layout: _Layout, meta: Mapping[str, Any], lists: Sequence[int]
    ) -> dict[int, ProbedList]:
        import pyarrow as pa
        import pyarrow.dataset as ds

        number, dimension = int(meta["index_version"]), int(meta["dimension"])
        empty = np.empty((0, dimension), dtype=np.float32)
        stored = self.vector if meta["encoding"] == ivf.LEGACY else ivf.BYTES
        columns = [*self.key_columns, *self.include]
        fragments = [f for i in lists for f in layout.fragments(number, i)]
        base = layout.dataset
        table = scan(
            ds.FileSystemDataset(fragments, base.schema, base.format, base.filesystem),
            [*columns, stored, "list_id"],
        )
        batches: dict[int, list[Any]] = {i: [] for i in lists}
        for batch in table.to_batches():  # a batch comes from one file: of one list
            if batch.num_rows:
                batches[int(batch.column("list_id")[0].as_py())].append(batch)
        out = {}
        for i, found in batches.items():
            rows = pa.Table.from_batches(found, table.schema)
            vectors = [
                ivf.stored_vectors(b.column(stored), dimension, str(meta["encoding"]))
                for b in found
            ]
            out[i] = ProbedList(
                rows.select(columns),
                vectors[0] if len(vectors) == 1 else np.concatenate(vectors or [empty]),
            )
        return out

    def _layout(self) -> _Layout:
        """The postings' files by list, found again only when the pointer moved: every
        iteration writes the pointer after its postings, so the postings as opened
        hold at least what the live version's pointer row says."""
        if self._layout_at is None or self._layout_at[0] != self._pointer_version:
            dataset = self.lake.open(self.location.postings).to_pyarrow_dataset()
            self._layout_at = (self._pointer_version, _Layout.of(dataset))
        return self._layout_at[1]

    def _ranked(
        self, probed: list[ProbedList], query: ivf.Vectors, metric: str, k: int
    ) -> list[VectorHit]:
        probed = [p for p in probed if len(p.vectors)]
        if not probed:
            return []
        found = np.concatenate(
            [ivf.distances(query.reshape(1, -1), p.vectors, metric)[0] for p in probed]
        )
        starts = np.cumsum([0] + [len(p.vectors) for p in probed])
        k = min(k, len(found))
        best = np.argpartition(found, k - 1)[:k]
        best = best[np.lexsort((best, found[best]))]  # ties by row, so results are stable
        hits = []
        for at in best:
            which = int(np.searchsorted(starts, at, side="right")) - 1
            row = local_times(probed[which].rows.slice(int(at - starts[which]), 1).to_pylist()[0])
            hits.append(
                VectorHit(
                    key={c: row[c] for c in self.key_columns},
                    distance=float(found[at]),
                    columns={c: row[c] for c in self.include},
                )
            )
        return hits


def _filtered(probed: ProbedList, conditions: Any) -> ProbedList:
    """The rows of a list that pass ``conditions`` (an Arrow expression, or None)."""
    if conditions is None:
        return probed
    import pyarrow as pa
    import pyarrow.dataset as ds

    numbered = probed.rows.append_column("__row", pa.array(np.arange(probed.rows.num_rows)))
    kept = ds.dataset(numbered).to_table(filter=conditions, use_threads=False)
    rows = kept.column("__row").to_numpy()
    return ProbedList(kept.drop_columns(["__row"]), probed.vectors[rows])


def _location(config: AppConfig, key: JobKey, options: Mapping[str, Any]) -> IndexLocation:
    database, table = target_table(key, options)
    return IndexLocation(
        postings=table_path(config, database, table),
        index=table_path(config, database, f"{table}__index"),
        centroids=table_path(config, database, f"{table}__centroids"),
    )


@dataclass(frozen=True)
class HybridHit:
    key: dict[str, Any]
    score: float
    """The fused score: sum over the rankings holding the key of 1 / (60 + rank)."""
    text_rank: int | None
    vector_rank: int | None


def hybrid_search(
    config: AppConfig,
    text_job: JobKey,
    vector_job: JobKey,
    query: str,
    vector: Sequence[float],
    *,
    k: int = 10,
    depth: int = 50,
    nprobe: int | None = None,
    filter: Mapping[str, Any] | None = None,
) -> list[HybridHit]:
    """BM25 over a ``fulltext_index`` job and k-NN over a ``vector_index`` job of the
    same table, each ranked ``depth`` deep, fused by reciprocal rank fusion (k = 60).
    The two jobs must share their key columns (by name)."""
    if text_job.database != vector_job.database or text_job.table != vector_job.table:
        raise SearchError(f"{text_job} and {vector_job} index different tables")
    text_options = job_options(config, text_job, "fulltext_index")
    searcher = VectorSearch.for_job(config, vector_job)
    key = list(text_options["primary_key"])
    if [c.lower() for c in key] != [c.lower() for c in searcher.key_columns]:
        raise SearchError(
            f"the jobs' keys differ: {key} (full-text) and {searcher.key_columns} (vector)"
        )
    terms = Tokenizer.from_options(text_options["tokenizer"]).terms(query)
    text_ranking: list[tuple[Any, ...]] = []
    if terms:
        lake = Lake(storage_of(config))
        path = table_path(config, *target_table(text_job, text_options))
        text_ranking = [doc for doc, _ in bm25(lake, path, key, terms, limit=depth)]
    vector_ranking = [
        tuple(hit.key[c] for c in searcher.key_columns)
        for hit in searcher.search(vector, k=depth, nprobe=nprobe, filter=filter)
    ]
    text_at = {doc: i for i, doc in enumerate(text_ranking, start=1)}
    vector_at = {doc: i for i, doc in enumerate(vector_ranking, start=1)}
    return [
        HybridHit(dict(zip(key, doc, strict=True)), score, text_at.get(doc), vector_at.get(doc))
        for doc, score in reciprocal_rank_fusion([text_ranking, vector_ranking], limit=k)
    ]
