"""Shared fixtures: one SparkSession and one real Kafka broker per test run.

Integration tests get a fresh topic and fresh state directories each, so they
share the session and the broker without seeing each other's data.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from pyspark.sql import SparkSession

from devkit.s3 import S3_AS_S3A_WITHOUT_LOG_STORE, LocalS3, with_hadoop_conf
from devkit.spark import ADAPTIVE_OFF, STACK, TEST_JAVA_OPTIONS, local_session
from lakeprop.config import AppConfig, EngineConfig, KafkaConfig, StateConfig, TablesConfig
from lakeprop.dev.localkafka import LocalKafka

T = TypeVar("T")

pytest_plugins = ["devkit.timing"]

# What every process a test starts inherits. Service processes (``spark-submit.sh``)
# skip the set-up: the test command has run it, and two of them must never install
# beside each other. Their JVMs compile quickly (``TEST_JAVA_OPTIONS``; the tests'
# own session overrides it).
os.environ.setdefault("LAKEPROP_SET_UP", "1")
os.environ.setdefault("JDK_JAVA_OPTIONS", " ".join(TEST_JAVA_OPTIONS))

_RUN_ORDER = ("unit", "integration", "chaos")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unit tests first (a second, and no JVM), then the integration tests, then those
    that run service processes of their own (``processes``), the chaos tests last:
    they then find the session's JVM compiled by the tests before them. On parallel
    workers (``-n``) the tests marked ``slow`` go first instead, the longest first
    (``slow(seconds=...)``), so that the short ones fill the workers in around them."""
    parallel = bool(getattr(config.option, "numprocesses", None))

    def rank(item: pytest.Item) -> tuple[float, int, int]:
        part = next(
            (i for i, part in enumerate(_RUN_ORDER) if f"tests/{part}/" in item.nodeid),
            len(_RUN_ORDER),
        )
        slow = item.get_closest_marker("slow")
        first = -float(slow.kwargs.get("seconds", 30)) if slow and parallel else 0.0
        return (first, part, int(item.get_closest_marker("processes") is not None))

    items.sort(key=rank)
    for item in items:
        if "tests/unit/" in item.nodeid:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real single-node KRaft broker on a free 127.0.0.1 port."""
    broker = LocalKafka(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The one SparkSession of a test run, with an embedded Hive metastore for the
    tests of metastore tables (path-based tests never touch it); on the default
    stack without adaptive execution (:data:`devkit.spark.ADAPTIVE_OFF`)."""
    session = local_session(
        metastore=tmp_path_factory.mktemp("metastore"),
        more=ADAPTIVE_OFF if STACK.name == "default" else None,
    )
    try:
        yield session
    finally:
        from devkit import timing  # loaded by pytest_plugins, after this module

        with contextlib.suppress(Exception):  # a JVM already gone reports nothing
            timing.SESSION_NOTES.append(timing.jvm_clocks(session))
        session.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[LocalS3]:
    """A real S3 API server on a free 127.0.0.1 port, which the tests' session reaches
    over ``s3a://`` (and over ``s3://``, mapped to S3A without lakeprop's log store:
    a scheme whose commits do not exclude other writers)."""
    server = LocalS3(tmp_path_factory.mktemp("s3")).start()
    try:  # the server stops whatever fails after it started
        with_hadoop_conf(spark, {**server.hadoop_conf(), **S3_AS_S3A_WITHOUT_LOG_STORE})
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: LocalS3) -> str:
    """A fresh bucket of the S3 server, as an ``s3a://`` URI."""
    return s3.create_bucket(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def app_config(tmp_path: Path, kafka: LocalKafka) -> AppConfig:
    """Config of one test: its own topic, state, checkpoint and warehouse."""
    return AppConfig(
        kafka=KafkaConfig(
            bootstrap_servers=kafka.bootstrap_servers,
            topic=f"changelog-{uuid.uuid4().hex[:12]}",
            topic_partitions=2,
            delivery_timeout=15.0,
        ),
        state=StateConfig(
            location=str(tmp_path / "state"), checkpoint_location=str(tmp_path / "checkpoint")
        ),
        tables=TablesConfig(resolution="path", warehouse=str(tmp_path / "warehouse")),
        engine=EngineConfig(workers=2, iteration_timeout=120.0, retry_base=0.5, retry_max=4.0),
        tick_interval=1.0,
        # a notified commit or a finished iteration starts its micro-batch within a
        # quarter second, not a second: a test waits less on every hop, and an
        # offset request with nothing new costs next to nothing
        poll_interval=0.25,
    )
