"""``fulltext_index``: an inverted index over chosen text columns, searchable with BM25.

Options::

    {"columns": ["title", "body"],      # required: the text columns to index
     "primary_key": ["doc_id"],         # required: the source's primary key
     "tokenizer": {                     # optional; these are the defaults
         "lowercase": true,
         "pattern": "[\\\\W_]+",        # separators (a regular expression)
         "stop_words": "english",       # "english", "none" or a list of words
         "min_length": 1},              # shorter terms are dropped
     "target_database": "search",       # optional, defaults to the source database
     "target_table": "docs_text"}       # optional, defaults to <table>_<job name>

The index holds one posting per (term, document, field): ``term``, the key
columns, ``field`` (the source column), ``tf`` (how often the term occurs
there) and ``positions`` (where, counting every token including stop words, so
phrase distances survive). A document's postings are rebuilt from its last
change in each range, so an update removes the terms its text lost and a
delete removes them all.

The tokenizer runs as Spark SQL functions when indexing (no Python UDF) and in
Python when a query is tokenized; the two agree because the pattern is applied
with Unicode character classes on both sides. :func:`bm25_search` ranks the
documents matching a query from the index alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType

from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.consumers.options import (
    TARGET_OPTIONS,
    identifier_list,
    reject_unknown_options,
    target_options,
)
from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError

#: Lucene's English stop set.
ENGLISH_STOP_WORDS = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    )
)
INDEX_COLUMNS = ("term", "field", "tf", "positions")
_RESERVED = {*INDEX_COLUMNS, "_doc", "_pos", "_word", "_delete"}
_ALLOWED = {"columns", "primary_key", "tokenizer", *TARGET_OPTIONS}
_TOKENIZER_KEYS = {"lowercase", "pattern", "stop_words", "min_length"}
_MAX_PATTERN = 200
_MAX_STOP_WORDS = 10_000


@dataclass(frozen=True)
class Tokenizer:
    """Splits text into terms: lower-case, split on ``pattern``, drop stop words and short terms."""

    lowercase: bool = True
    pattern: str = r"[\W_]+"
    stop_words: frozenset[str] = ENGLISH_STOP_WORDS
    min_length: int = 1

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> Tokenizer:
        """The tokenizer an (already validated) ``tokenizer`` option describes."""
        options = options or {}
        lowercase = bool(options.get("lowercase", True))
        words = options.get("stop_words", "english")
        if words == "english":
            stop = ENGLISH_STOP_WORDS
        elif words == "none":
            stop = frozenset()
        else:
            stop = frozenset(w.lower() if lowercase else w for w in words)
        return cls(
            lowercase=lowercase,
            pattern=options.get("pattern", cls.pattern),
            stop_words=stop,
            min_length=int(options.get("min_length", 1)),
        )

    # -- Python (queries, and tests' from-scratch indexes) ----------------------------

    def tokens(self, text: str | None) -> list[tuple[int, str]]:
        """(position, term) of every indexed term of ``text``."""
        if text is None:
            return []
        if self.lowercase:
            text = text.lower()
        words = [w for w in re.split(self.pattern, text) if w]
        return [(i, w) for i, w in enumerate(words) if self._keeps(w)]

    def terms(self, text: str) -> list[str]:
        """The distinct terms of a query, in order of first appearance."""
        return list(dict.fromkeys(term for _, term in self.tokens(text)))

    def _keeps(self, term: str) -> bool:
        return len(term) >= self.min_length and term not in self.stop_words

    # -- Spark (indexing) -------------------------------------------------------------

    def words(self, text: Column) -> Column:
        """The non-empty tokens of ``text`` as an array column (stop words still in)."""
        if self.lowercase:
            text = F.lower(text)
        # (?U): Java's \w, \W, \s match Unicode as Python's do.
        return F.filter(F.split(text, "(?U)" + self.pattern), lambda w: w != F.lit(""))

    def keeps(self, term: Column) -> Column:
        kept = F.length(term) >= F.lit(self.min_length)
        if self.stop_words:
            kept = kept & ~term.isin(sorted(self.stop_words))
        return kept


def validate_tokenizer(value: object) -> dict[str, Any]:  # noqa: C901 - one check per option
    """The normalised ``tokenizer`` option, or a clear error."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise InvalidConsumerOptionsError("fulltext_index option tokenizer must be an object")
    reject_unknown_options("fulltext_index tokenizer", value, _TOKENIZER_KEYS)
    lowercase = value.get("lowercase", True)
    if not isinstance(lowercase, bool):
        raise InvalidConsumerOptionsError(
            "fulltext_index tokenizer.lowercase must be true or false"
        )
    pattern = value.get("pattern", Tokenizer.pattern)
    if not isinstance(pattern, str) or not pattern or len(pattern) > _MAX_PATTERN:
        raise InvalidConsumerOptionsError(
            f"fulltext_index tokenizer.pattern must be a regular expression of 1 to "
            f"{_MAX_PATTERN} characters"
        )
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise InvalidConsumerOptionsError(
            f"fulltext_index tokenizer.pattern {pattern!r} is not a regular expression: {exc}"
        ) from None
    if compiled.groups:
        raise InvalidConsumerOptionsError(
            "fulltext_index tokenizer.pattern must not capture: write (?:...) for groups"
        )
    if compiled.fullmatch(""):
        raise InvalidConsumerOptionsError(
            f"fulltext_index tokenizer.pattern {pattern!r} matches the empty string"
        )
    stop_words = value.get("stop_words", "english")
    if stop_words not in ("english", "none"):
        if (
            not isinstance(stop_words, list)
            or len(stop_words) > _MAX_STOP_WORDS
            or not all(isinstance(w, str) and w for w in stop_words)
        ):
            raise InvalidConsumerOptionsError(
                'fulltext_index tokenizer.stop_words must be "english", "none" or a list of '
                f"at most {_MAX_STOP_WORDS} non-empty strings"
            )
        stop_words = sorted(set(stop_words))
    min_length = value.get("min_length", 1)
    if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 1:
        raise InvalidConsumerOptionsError(
            "fulltext_index tokenizer.min_length must be a positive integer"
        )
    return {
        "lowercase": lowercase,
        "pattern": pattern,
        "stop_words": stop_words,
        "min_length": min_length,
    }


def postings(
    rows: DataFrame, key: Sequence[str], columns: Sequence[str], tokenizer: Tokenizer
) -> DataFrame:
    """The index entries of ``rows``: term, key..., field, tf, positions."""
    fields = F.array(
        *[F.struct(F.lit(c).alias("field"), F.col(c).cast("string").alias("text")) for c in columns]
    )
    tokens = (
        rows.select(*key, F.explode(fields).alias("_doc"))
        .select(
            *key,
            "_doc.field",
            F.posexplode(tokenizer.words(F.col("_doc.text"))).alias("_pos", "_word"),
        )
        .where(tokenizer.keeps(F.col("_word")))
    )
    return tokens.groupBy(F.col("_word").alias("term"), *key, "field").agg(
        F.count("*").cast("int").alias("tf"),
        F.array_sort(F.collect_list(F.col("_pos").cast("int"))).alias("positions"),
    )


class FulltextIndexConsumer(Consumer):
    """An inverted index with positions, rebuilt per changed document."""

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        reject_unknown_options("fulltext_index", options, _ALLOWED)
        try:
            out: dict[str, Any] = {
                "columns": identifier_list(options.get("columns"), "fulltext_index", "columns"),
                "primary_key": identifier_list(
                    options.get("primary_key"), "fulltext_index", "primary_key"
                ),
                "tokenizer": validate_tokenizer(options.get("tokenizer")),
            }
            out.update(target_options(options))
        except InvalidIdentifierError as exc:
            raise InvalidConsumerOptionsError(f"fulltext_index: {exc}") from None
        clash = sorted({k.lower() for k in out["primary_key"]} & _RESERVED)
        if clash:
            raise InvalidConsumerOptionsError(
                f"fulltext_index primary_key column(s) {clash} clash with names the index uses: "
                f"{sorted(_RESERVED)}"
            )
        return out

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        key = list(options["primary_key"])
        return key + [c for c in options["columns"] if c not in key]

    @classmethod
    def key_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return list(options["primary_key"])

    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        options = context.options
        self.key: list[str] = list(options["primary_key"])
        self.columns: list[str] = list(options["columns"])
        self.tokenizer = Tokenizer.from_options(options.get("tokenizer"))

    def snapshot(self, rows: DataFrame, version: int) -> int:
        index = postings(rows, self.key, self.columns, self.tokenizer).persist()
        try:
            written = int(index.count())
            self.overwrite(index, version)
            return written
        finally:
            index.unpersist()

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        target = self.require_target()
        latest = self.context.latest_changes(changes, self.key)
        fresh = postings(
            latest.where(F.col("_change_type") != "delete"), self.key, self.columns, self.tokenizer
        )
        entry = ["term", *self.key, "field"]
        # The postings the changed documents have now and will not keep.
        stale = (
            target.delta()
            .toDF()
            .where(reduce(lambda a, b: a & b, self.context.in_change_range(self.key), F.lit(True)))
            .join(F.broadcast(latest.select(*self.key).distinct()), self.key, "left_semi")
            .select(*entry)
            .join(fresh.select(*entry), entry, "left_anti")
            .withColumn("tf", F.lit(None).cast(IntegerType()))
            .withColumn("positions", F.lit(None).cast(ArrayType(IntegerType())))
        )
        source = (
            fresh.withColumn("_delete", F.lit(False))
            .unionByName(stale.withColumn("_delete", F.lit(True)))
            .persist()
        )
        try:
            written = int(source.count())
            if written == 0:
                return 0
            matched = [F.col(f"t.{c}") == F.col(f"s.{c}") for c in entry]
            on = reduce(lambda a, b: a & b, matched + self.context.in_change_range(self.key, "t"))
            values: dict[str, str | Column] = {
                c: F.col(f"s.{c}") for c in [*entry, "tf", "positions"]
            }
            with self.context.idempotent(to_version):
                (
                    target.delta()
                    .alias("t")
                    .merge(source.alias("s"), on)
                    .whenMatchedDelete(condition=F.col("s._delete"))
                    .whenMatchedUpdate(set={c: values[c] for c in ("tf", "positions")})
                    .whenNotMatchedInsert(condition=~F.col("s._delete"), values=values)
                    .execute()
                )
            return written
        finally:
            source.unpersist()


@dataclass(frozen=True)
class Bm25:
    """BM25 parameters: ``k1`` saturates term frequency, ``b`` normalises length."""

    k1: float = 1.2
    b: float = 0.75


def bm25_search(
    index: DataFrame,
    primary_key: Sequence[str],
    terms: Sequence[str],
    *,
    fields: Sequence[str] | None = None,
    limit: int = 10,
    params: Bm25 | None = None,
) -> DataFrame:
    """The best ``limit`` documents for ``terms``: key columns and ``score``, best first.

    Computed from the index alone (restricted to ``fields`` when given):
    ``N`` is the number of documents with at least one indexed term, a
    document's length ``dl`` the sum of its term frequencies, ``avgdl`` the mean
    length, ``df`` the number of documents holding a term, and

        idf   = ln(1 + (N - df + 0.5) / (df + 0.5))
        score = sum over terms of idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    Ties rank by key, so results are stable.
    """
    params = params or Bm25()
    key = list(primary_key)
    if fields:
        index = index.where(F.col("field").isin(list(fields)))
    docs = index.groupBy(*key).agg(F.sum("tf").alias("dl"))
    stats = docs.agg(F.count("*").alias("n"), F.avg("dl").alias("avgdl"))
    hits = (
        index.where(F.col("term").isin(list(terms)))
        .groupBy(*key, "term")
        .agg(F.sum("tf").alias("tf"))
    )
    df = hits.groupBy("term").agg(F.count("*").alias("df"))
    k1, b = F.lit(params.k1), F.lit(params.b)
    idf = F.log(1 + (F.col("n") - F.col("df") + 0.5) / (F.col("df") + 0.5))
    norm = k1 * (1 - b + b * F.col("dl") / F.col("avgdl"))
    score = idf * F.col("tf") * (k1 + 1) / (F.col("tf") + norm)
    return (
        hits.join(df, "term")
        .join(docs, key)
        .crossJoin(stats)
        .groupBy(*key)
        .agg(F.sum(score).alias("score"))
        .orderBy(F.desc("score"), *key)
        .limit(limit)
    )
