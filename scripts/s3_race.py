"""Spark and delta-rs appending to one Delta table on a local S3 API server at once,
with Delta's default S3 log store and with lakeprop's: how many commits each lost.

Every writer appends one row per commit with a token of its own and remembers the
tokens its engine reported committed. At the end a token missing from the table is
a lost commit, and so is a commit file written twice (the server's request log).

    .venv/bin/python scripts/s3_race.py --seconds 120 --rust-writers 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable as RustTable  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from devkit.s3 import (  # noqa: E402
    S3_AS_S3A_WITHOUT_LOG_STORE,
    LocalS3,
    log_audit,
    with_hadoop_conf,
)
from devkit.spark import local_session  # noqa: E402
from lakeprop.config import AppConfig  # noqa: E402
from lakeprop.tables.stores import session_storage  # noqa: E402

STORES = {
    "default": "s3",  # s3:// is S3A without a log store set: Delta's S3SingleDriverLogStore
    "lakeprop": "s3a",  # spark.delta.logStore.s3a.impl = lakeprop's conditional PUT
}


def race(spark: object, s3: LocalS3, uri: str, seconds: float, rust_writers: int) -> str:
    schema = "token STRING, writer STRING"
    spark.createDataFrame([("created", "spark")], schema).write.format("delta").save(uri)  # type: ignore[attr-defined]
    options = session_storage(spark, AppConfig()).options(uri.replace("s3://", "s3a://"))  # type: ignore[arg-type]
    rust_uri = uri.replace("s3://", "s3a://")
    committed = ["created"]
    failures: list[str] = []
    deadline = time.monotonic() + seconds

    def spark_writer() -> None:
        i = 0
        while time.monotonic() < deadline:
            token = f"spark-{i}"
            frame = spark.createDataFrame([(token, "spark")], schema)  # type: ignore[attr-defined]
            try:
                frame.write.format("delta").mode("append").save(uri)
                committed.append(token)
            except Exception as exc:  # a refused commit Delta gave up on: not committed
                failures.append(f"spark: {str(exc).splitlines()[0][:120]}")
            i += 1

    def rust_writer(n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            token = f"rs{n}-{i}"
            try:
                write_deltalake(
                    rust_uri,
                    pa.table({"token": [token], "writer": ["delta-rs"]}),
                    mode="append",
                    storage_options=options,
                )
                committed.append(token)
            except Exception as exc:
                failures.append(f"delta-rs: {str(exc).splitlines()[0][:120]}")
            i += 1

    threads = [threading.Thread(target=spark_writer)] + [
        threading.Thread(target=rust_writer, args=(n,)) for n in range(rust_writers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = {
        r["token"]
        for r in RustTable(rust_uri, storage_options=options).to_pyarrow_table().to_pylist()
    }
    lost = [token for token in committed if token not in found]
    table = rust_uri.removeprefix("s3a://")
    overwritten = [p for p in log_audit(s3) if p.startswith(table)]
    refused = sum(
        1
        for r in s3.requests()
        if r.method == "PUT" and r.key.startswith(f"{table}/_delta_log/") and r.error
    )
    return (
        f"{len(committed)} commits reported, {len(lost)} lost {lost[:5]}, "
        f"{len(overwritten)} commit files overwritten, {refused} conditional PUTs refused, "
        f"{len(failures)} writes failed"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=120.0, help="per log store")
    parser.add_argument("--rust-writers", type=int, default=2)
    parser.add_argument("--store", choices=sorted(STORES), action="append")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lakeprop-s3-race-") as work:
        s3 = LocalS3(Path(work) / "s3").start()
        spark = local_session("lakeprop-s3-race")
        try:
            with_hadoop_conf(spark, {**s3.hadoop_conf(), **S3_AS_S3A_WITHOUT_LOG_STORE})
            for name in args.store or sorted(STORES):
                bucket = s3.create_bucket(f"race-{name}").removeprefix("s3a://")
                uri = f"{STORES[name]}://{bucket}/table"
                print(f"{name} log store ({uri}): ", end="", flush=True)
                print(race(spark, s3, uri, args.seconds, args.rust_writers), flush=True)
        finally:
            spark.stop()
            s3.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
