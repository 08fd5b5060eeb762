"""The search verbs: full-text, vector and hybrid search over the service's indexes,
without Spark.

    lakeprop search --database kb --table articles --name text "delta merge" --limit 5
    lakeprop vector-search --database kb --table articles --name vec --vector "[0.1, 0.7]" -k 5
    lakeprop hybrid-search --database kb --table articles --text-job text --vector-job vec \\
        "delta merge" --vector "[0.1, 0.7]"
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from lakeprop.cli import common
from lakeprop.errors import InvalidArgumentError
from lakeprop.spec import JobKey


def text_search(args: argparse.Namespace) -> int:
    from lakeprop.client.search import search

    hits = search(
        common.config(args), common.key(args), args.query, limit=args.limit, fields=args.field
    )
    for hit in hits:
        print(json.dumps({"score": round(hit.score, 6), "key": hit.key}, default=str))
    return 0


def query_vector(text: str) -> list[float]:
    value = common.json_argument(text, "--vector")
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value
    ):
        raise InvalidArgumentError("--vector must be a JSON array of numbers")
    return [float(x) for x in value]


def filter_argument(args: argparse.Namespace) -> Any:
    value = common.json_argument(args.filter, "--filter") if args.filter else None
    if value is not None and not isinstance(value, dict):
        raise InvalidArgumentError("--filter must be a JSON object")
    return value


def vector_search(args: argparse.Namespace) -> int:
    from lakeprop.client.vectors import VectorSearch

    searcher = VectorSearch.for_job(common.config(args), common.key(args))
    hits = searcher.search(
        query_vector(args.vector), k=args.k, nprobe=args.nprobe, filter=filter_argument(args)
    )
    for hit in hits:
        line = {"distance": round(hit.distance, 6), "key": hit.key, "columns": hit.columns}
        print(json.dumps(line, default=str))
    return 0


def hybrid_search(args: argparse.Namespace) -> int:
    from lakeprop.client.vectors import hybrid_search as fused

    hits = fused(
        common.config(args),
        JobKey(args.account, args.database, args.table, args.text_job),
        JobKey(args.account, args.database, args.table, args.vector_job),
        args.query,
        query_vector(args.vector),
        k=args.k,
        nprobe=args.nprobe,
        filter=filter_argument(args),
    )
    for hit in hits:
        line = {
            "score": round(hit.score, 6),
            "key": hit.key,
            "text_rank": hit.text_rank,
            "vector_rank": hit.vector_rank,
        }
        print(json.dumps(line, default=str))
    return 0


def add_vector_query(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vector", required=True, help="the query vector: a JSON array, or @file")
    p.add_argument("-k", type=int, default=10, help="how many results (default 10)")
    p.add_argument("--nprobe", type=int, help="lists to probe (default: the index's)")
    p.add_argument("--filter", help='included columns\' conditions, JSON: {"lang": "en"}')


def register(sub: Any) -> None:
    p = sub.add_parser("search", help="rank documents of a fulltext_index job with BM25")
    common.add_key(p)
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--field", action="append", help="search only this indexed column (repeatable)")
    p.set_defaults(handler=text_search)
    p = sub.add_parser("vector-search", help="the k nearest rows of a vector_index job")
    common.add_key(p)
    add_vector_query(p)
    p.set_defaults(handler=vector_search)
    p = sub.add_parser(
        "hybrid-search",
        help="BM25 and k-NN over two jobs of one table, fused by reciprocal rank fusion",
    )
    p.add_argument("--account", type=int, default=0, help="tenant account id (default 0)")
    p.add_argument("--database", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--text-job", required=True, help="the fulltext_index job's name")
    p.add_argument("--vector-job", required=True, help="the vector_index job's name")
    p.add_argument("query", help="the text query")
    add_vector_query(p)
    p.set_defaults(handler=hybrid_search)
