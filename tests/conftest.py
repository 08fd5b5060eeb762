"""Shared fixtures: one SparkSession and one real Kafka broker per test run.

Integration tests get a fresh topic and fresh state directories each, so they
share the session and the broker without seeing each other's data.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import SparkSession

from lakeprop.config import AppConfig, EngineConfig, KafkaConfig, StateConfig, TablesConfig
from lakeprop.dev.localkafka import LocalKafka
from tests.support.spark import local_session

T = TypeVar("T")


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real single-node KRaft broker on a free 127.0.0.1 port."""
    broker = LocalKafka(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of a test run."""
    session = local_session()
    try:
        yield session
    finally:
        session.stop()


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
    )


def assert_eventually(check: Callable[[], T], timeout: float = 30.0, interval: float = 0.5) -> T:
    """Retry ``check`` until it stops raising AssertionError or the timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(interval)


def produce_raw(
    bootstrap_servers: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes | None]],
    **config: Any,
) -> list[tuple[int, int]]:
    """Produce raw (key, value) messages in order, bypassing the client's validation.

    Returns (partition, offset) of each. One partition is forced so the offsets say
    which message is which. ``config`` adds producer properties (dots as in Kafka).
    """
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, **config}
    )
    coordinates: list[Any] = [None] * len(messages)

    def recorder(i: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            coordinates[i] = (msg.partition(), msg.offset())

        return on_delivery

    for i, (key, value) in enumerate(messages):
        producer.produce(topic, key=key, value=value, partition=0, on_delivery=recorder(i))
    assert producer.flush(30) == 0
    return coordinates
