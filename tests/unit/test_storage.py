"""Which commits exclude which, and how delta-rs reaches S3 (no Spark)."""

from __future__ import annotations

import pytest

from devkit.s3 import Request
from lakeprop.storage import CONDITIONAL_PUT_LOG_STORE, DYNAMODB_LOG_STORE, Storage, scheme

S3A_CONF = {
    "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
    "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
    "spark.hadoop.fs.s3a.path.style.access": "true",
    "spark.hadoop.fs.s3a.access.key": "key",
    "spark.hadoop.fs.s3a.secret.key": "secret",
    "spark.sql.shuffle.partitions": "2",
}


def test_schemes() -> None:
    assert scheme("s3a://lake/t") == "s3a"
    assert scheme("/tmp/lake/t") == "file"
    assert scheme("file:/tmp/t") == "file"
    assert scheme("C:/data") == "file"
    assert scheme("ABFSS://c@a.dfs.core.windows.net/t") == "abfss"


def test_delta_rs_reaches_s3_with_the_s3a_settings() -> None:
    storage = Storage.from_spark_conf(S3A_CONF)
    assert storage.options("s3a://lake/t") == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    assert storage.options("/tmp/lake/t") == {}


def test_a_bucket_setting_wins_for_its_bucket_and_the_live_configuration_over_the_file() -> None:
    storage = Storage.from_spark_conf(
        {**S3A_CONF, "spark.hadoop.fs.s3a.bucket.other.endpoint": "s3.eu-central-1.amazonaws.com"},
        overrides={"AWS_REGION": "us-east-2"},
        hadoop={"fs.s3a.connection.ssl.enabled": "false", "fs.s3a.endpoint": "minio:9000"},
    )
    assert storage.options("s3a://lake/t")["AWS_ENDPOINT_URL"] == "http://minio:9000"
    other = storage.options("s3://other/t")
    assert other["AWS_ENDPOINT_URL"] == "http://s3.eu-central-1.amazonaws.com"
    assert other["AWS_REGION"] == "us-east-2"  # engine.native_storage_options wins


def test_https_by_default_and_no_credentials_unless_set() -> None:
    storage = Storage.from_spark_conf({"spark.hadoop.fs.s3a.endpoint": "s3.amazonaws.com"})
    assert storage.options("s3a://lake/t") == {"AWS_ENDPOINT_URL": "https://s3.amazonaws.com"}


@pytest.mark.parametrize(
    ("location", "log_store", "instances", "engines"),
    [
        ("/tmp/lake/t", "", True, True),
        ("hdfs://nn/lake/t", "", True, True),
        ("abfss://c@a.dfs.core.windows.net/t", "", True, True),
        ("gs://lake/t", "", True, True),
        ("s3a://lake/t", "", False, False),
        ("s3://lake/t", "", False, False),
        ("s3a://lake/t", "io.delta.storage.S3SingleDriverLogStore", False, False),
        ("s3a://lake/t", CONDITIONAL_PUT_LOG_STORE, True, True),
        ("s3a://lake/t", DYNAMODB_LOG_STORE, True, False),
        ("wasbs://c@a.blob.core.windows.net/t", "", False, False),
        ("dbfs:/lake/t", "", True, False),
        ("oss://lake/t", "", True, False),  # a store lakeprop knows nothing of: no native path
    ],
)
def test_commit_safety(location: str, log_store: str, instances: bool, engines: bool) -> None:
    kind = scheme(location)
    conf = {f"spark.delta.logStore.{kind}.impl": log_store} if log_store else {}
    safety = Storage.from_spark_conf(conf).safety(location)
    assert (safety.across_instances, safety.across_engines) == (instances, engines)
    assert bool(safety.why) == (not instances or not engines)


def test_the_refusal_says_what_to_set() -> None:
    why = Storage.from_spark_conf({}).safety("s3a://lake/state/catalog").why
    assert "S3SingleDriverLogStore" in why
    assert f"spark.delta.logStore.s3a.impl={CONDITIONAL_PUT_LOG_STORE}" in why


def test_the_log_store_is_per_scheme_then_the_class_setting() -> None:
    storage = Storage.from_spark_conf(
        {
            "spark.delta.logStore.class": CONDITIONAL_PUT_LOG_STORE,
            "spark.delta.logStore.s3.impl": "io.delta.storage.S3SingleDriverLogStore",
        }
    )
    assert storage.safety("s3a://lake/t").across_instances
    assert not storage.safety("s3://lake/t").across_instances


def test_databricks_commits_exclude_its_clusters_but_not_delta_rs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")
    storage = Storage.from_spark_conf({})
    for location in ("s3://lake/t", "/Volumes/main/lake/t", "dbfs:/lake/t"):
        safety = storage.safety(location)
        assert (safety.across_instances, safety.across_engines) == (True, False), location
    assert storage.safety("abfss://c@a.dfs.core.windows.net/t").across_engines


def test_delta_reads_the_log_store_without_the_spark_prefix_too() -> None:
    storage = Storage.from_spark_conf({"delta.logStore.s3a.impl": CONDITIONAL_PUT_LOG_STORE})
    assert storage.safety("s3a://lake/t").across_engines
    both = Storage.from_spark_conf(
        {
            "delta.logStore.s3a.impl": CONDITIONAL_PUT_LOG_STORE,
            "spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore",
        }
    )
    assert not both.safety("s3a://lake/t").across_engines


def test_the_test_servers_request_log_names_what_each_request_touched() -> None:
    listing = Request("GET", "/bkt?list-type=2&prefix=w%2Fdb%2Ft1%2F_delta_log%2F&delimiter=%2F")
    assert (listing.kind, listing.key) == ("LIST", "bkt/w/db/t1/_delta_log/")
    head = Request("HEAD", "/bkt/w/db/t1/_delta_log/00000000000000000002.json")
    assert (head.kind, head.key) == ("HEAD", "bkt/w/db/t1/_delta_log/00000000000000000002.json")
    assert Request("GET", "/bkt").kind == "LIST"
