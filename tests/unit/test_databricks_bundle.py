"""The Databricks bundle names an entry point, parameters and settings that work."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakeprop import cli
from lakeprop.config import load_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "databricks.yml").read_text())
    return loaded


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def job(bundle: dict[str, Any]) -> dict[str, Any]:
    jobs: dict[str, Any] = bundle["resources"]["jobs"]
    return jobs["lakeprop"]


def cluster(bundle: dict[str, Any]) -> dict[str, Any]:
    (spec,) = job(bundle)["job_clusters"]
    new_cluster: dict[str, Any] = spec["new_cluster"]
    return new_cluster


def test_the_wheel_task_names_the_package_and_its_console_entry_point(
    bundle: dict[str, Any], project: dict[str, Any]
) -> None:
    (task,) = job(bundle)["tasks"]
    wheel = task["python_wheel_task"]
    assert wheel["package_name"] == project["name"]
    module, function = project["scripts"][wheel["entry_point"]].split(":")
    assert getattr(importlib.import_module(module), function) is cli.main
    assert task["libraries"] == [{"whl": "./dist/*.whl"}]
    build = bundle["artifacts"]["lakeprop_wheel"]
    assert build["type"] == "whl" and "wheel --no-deps -w dist ." in build["build"]
    assert task["job_cluster_key"] == job(bundle)["job_clusters"][0]["job_cluster_key"]


def test_the_parameters_parse_and_name_the_shipped_config_which_loads_from_the_clusters_env(
    bundle: dict[str, Any],
) -> None:
    (task,) = job(bundle)["tasks"]
    parameters = [
        p.replace("${workspace.file_path}", str(ROOT))
        for p in task["python_wheel_task"]["parameters"]
    ]
    args = cli.parser().parse_args(parameters)
    assert args.command == "run"
    assert Path(args.config).is_file()
    # every ${NAME} the config reads comes from the cluster's environment, from secrets
    env = cluster(bundle)["spark_env_vars"]
    wanted = set(re.findall(r"\$\{([A-Z_]+)\}", Path(args.config).read_text()))
    assert wanted == set(env)
    for value in env.values():
        assert re.fullmatch(r"\{\{secrets/\$\{var\.secret_scope\}/\w+\}\}", value), value
    config = load_config(args.config, environ={name: f"<{name}>" for name in env})
    assert config.kafka.bootstrap_servers == "<LAKEPROP_KAFKA_BOOTSTRAP>"
    assert config.metrics.enabled


def test_the_job_runs_one_continuous_service_on_dedicated_compute(bundle: dict[str, Any]) -> None:
    spec = job(bundle)
    assert spec["continuous"] == {"pause_status": "UNPAUSED"}
    assert spec["max_concurrent_runs"] == 1
    assert cluster(bundle)["data_security_mode"] == "SINGLE_USER"
    runtime = bundle["variables"]["spark_version"]["default"]
    assert re.fullmatch(r"1[7-9]\.\d+\.x-scala2\.13", runtime)  # Spark 4, Scala 2.13
    assert {"dev", "prod"} <= set(bundle["targets"])


def test_the_scale_out_example_runs_two_instances_with_their_own_ids() -> None:
    example: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / "scale-out" / "databricks.yml").read_text()
    )
    jobs = example["resources"]["jobs"]
    ids = []
    for spec in jobs.values():
        (task,) = spec["tasks"]
        parameters = [
            p.replace("${workspace.file_path}", str(ROOT))
            for p in task["python_wheel_task"]["parameters"]
        ]
        args = cli.parser().parse_args(parameters)
        assert args.command == "run" and spec["max_concurrent_runs"] == 1
        overrides = dict(item.split("=", 1) for item in args.set)
        env = spec["job_clusters"][0]["new_cluster"]["spark_env_vars"]
        config = load_config(args.config, overrides, environ={n: f"<{n}>" for n in env})
        assert config.cluster.enabled
        ids.append(config.cluster.instance())
    assert len(ids) == 2 and len(set(ids)) == 2
