"""Configuration loading and validation (no Spark)."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from lakeprop.config import AppConfig, SparkConfig, is_duration, load_config
from lakeprop.errors import InvalidConfigError
from lakeprop.session import client_spark_config
from lakeprop.stack import spark_packages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["local", "cluster", "databricks"])
def test_shipped_configs_load(name: str) -> None:
    env = {
        "LAKEPROP_KAFKA_BOOTSTRAP": "k:9092",
        "LAKEPROP_STATE": "s3://bucket/lp",
        "LAKEPROP_KAFKA_JAAS": "secret",
    }
    config = load_config(ROOT / "conf" / f"{name}.toml", environ=env)
    assert isinstance(config, AppConfig)
    assert config.tick_interval == 10.0
    if name == "cluster":
        assert config.kafka.bootstrap_servers == "k:9092"
        assert config.state.location == "s3://bucket/lp/state"
    if name == "databricks":
        assert config.kafka.options["sasl.jaas.config"] == "secret"


def test_environment_and_overrides_win_in_that_order(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('tick_interval = "5s"\n[kafka]\ntopic = "from_file"\n')
    config = load_config(
        path,
        overrides={"kafka.topic": "from_override", "kafka.topic_partitions": "4"},
        environ={"LAKEPROP__KAFKA__TOPIC": "from_env", "LAKEPROP__TICK_INTERVAL": "2s"},
    )
    assert (config.kafka.topic, config.kafka.topic_partitions, config.tick_interval) == (
        "from_override",
        4,
        2.0,
    )


def test_relative_local_paths_become_absolute_and_uris_stay() -> None:
    config = load_config(
        None, {"state.location": "rel/state", "tables.warehouse": "s3://w"}, environ={}
    )
    assert config.state.location == os.path.abspath("rel/state")
    assert config.tables.warehouse == "s3://w"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"kafka.nope": "1"}, "unknown setting(s) ['nope'] in kafka"),
        ({"kafka.topic": "bad topic"}, "not a valid topic name"),
        ({"kafka.topic_partitions": "0"}, "must be positive"),
        ({"kafka.topic_partitions": '"three"'}, "must be of type int"),
        ({"tick_interval": "soon"}, "tick_interval"),
        ({"tables.resolution": "guess"}, "'path' or 'metastore'"),
        ({"kafka.starting_offsets": "middle"}, "'earliest' or 'latest'"),
    ],
)
def test_bad_settings_are_named(overrides: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        load_config(None, overrides, environ={})
    assert words in str(info.value)


def test_a_missing_secret_variable_is_named() -> None:
    with pytest.raises(InvalidConfigError, match=r"\$\{LAKEPROP_KAFKA_JAAS\}, which is not set"):
        load_config(ROOT / "conf" / "databricks.toml", environ={"LAKEPROP_KAFKA_BOOTSTRAP": "k"})


def test_missing_or_broken_files() -> None:
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_config("/nonexistent.toml", environ={})


def test_a_client_session_is_local_and_brings_delta_unless_the_config_says_otherwise() -> None:
    cluster = SparkConfig(app_name="x", master=None, conf={"spark.scheduler.mode": "FAIR"})
    client = client_spark_config(cluster)
    assert (client.master, client.packages) == ("local[1]", spark_packages())
    assert client.conf == {"spark.ui.showConsoleProgress": "false", "spark.scheduler.mode": "FAIR"}
    local = SparkConfig(master="local[2]", jars_dir="/jars")
    assert (client_spark_config(local).master, client_spark_config(local).packages) == (
        "local[2]",
        (),
    )


def _sections(cls: type, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every setting: (dotted name, field, resolved type)."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            found += _sections(hints[f.name], f"{prefix}{f.name}.")
        else:
            found.append((f"{prefix}{f.name}", f, hints[f.name]))
    return found


def test_every_setting_is_converted_by_its_field_not_by_its_name() -> None:
    """A duration is marked on its field, a list or a table by its type: a renamed
    field keeps its conversion."""
    settings = _sections(AppConfig)
    durations = [name for name, f, _ in settings if is_duration(f)]
    assert len(durations) == 19
    given = {name: '"2m"' for name in durations} | {"cluster.session_timeout": '"6m"'}
    config = load_config(overrides=given)
    for name in set(durations) - {"cluster.session_timeout"}:
        section, _, leaf = name.rpartition(".")
        holder = config if not section else getattr(config, section)
        assert getattr(holder, leaf) == 120.0, name
    tables = [name for name, _, hint in settings if hint == Mapping[str, str]]
    assert tables == [
        "kafka.options",
        "kafka.source_options",
        "spark.conf",
        "engine.native_storage_options",
    ]
    config = load_config(overrides={name: '{"a": 1}' for name in tables})
    assert config.spark.conf == {"a": "1"}
    with pytest.raises(InvalidConfigError, match=r"spark\.packages must be a list"):
        load_config(overrides={"spark.packages": '"x"'})
