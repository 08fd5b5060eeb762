"""The notebooks run headless against the state of a short real run, and plot.

The three notebooks share one kernel, started in ``notebooks/`` as Jupyter would
start it; the kernel builds its own Spark session from a config file, as a
notebook outside Databricks does. The executed copies are kept under
``.lakeprop/notebooks/`` (CI artifacts, not in git).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from pyspark.sql import SparkSession

from devkit.harness import cdf_source, running, wait_for_watermark
from devkit.kafka import produce_raw
from devkit.spark import spark_toml
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.spec import JobKey

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / ".lakeprop" / "notebooks"
DOCS = "id INT, title STRING, body STRING"


def kernel_config(config: AppConfig, path: Path) -> Path:
    """The service's config as a file, for the kernel's own local session."""
    path.write_text(
        f"""[kafka]
bootstrap_servers = "{config.kafka.bootstrap_servers}"
topic = "{config.kafka.topic}"
[state]
location = "{config.state.location}"
checkpoint_location = "{config.state.checkpoint_location}"
[tables]
warehouse = "{config.tables.warehouse}"
{spark_toml("lakeprop-notebook", "local[1]")}"""
    )
    return path


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelManager]:
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(NOTEBOOKS))
    try:
        yield manager
    finally:
        manager.shutdown_kernel(now=True)


def execute(kernel: KernelManager, name: str, parameters: str) -> Any:
    """Run ``notebooks/<name>.ipynb`` with its parameters cell replaced; keep the copy."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    (cell,) = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    cell.source = parameters
    client = NotebookClient(
        notebook, km=kernel, timeout=300, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    try:
        client.execute()
    finally:
        EXECUTED.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, EXECUTED / f"{name}.ipynb")
    return notebook


def plots(notebook: Any) -> list[bool]:
    """Whether each cell tagged ``plot`` produced an image."""
    return [
        any("image/png" in output.get("data", {}) for output in cell.outputs)
        for cell in notebook.cells
        if "plot" in cell.metadata.get("tags", [])
    ]


def text(notebook: Any) -> str:
    """Everything the cells printed or showed as text."""
    return "\n".join(
        output.get("text", "") or output.get("data", {}).get("text/plain", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def test_the_notebooks_show_the_state_of_a_real_run_with_a_plot_in_every_plot_cell(
    spark: SparkSession, app_config: AppConfig, kernel: KernelManager, tmp_path: Path
) -> None:
    path = cdf_source(spark, app_config, "kb", "docs", DOCS)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    copy, text_job = JobKey(2, "kb", "docs", "copy"), JobKey(2, "kb", "docs", "text")
    client.register_job(
        copy,
        {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}},
    )
    client.register_job(
        text_job,
        {
            "iteration": {
                "consumer": {
                    "type": "fulltext_index",
                    "options": {"columns": ["body"], "primary_key": ["id"]},
                }
            }
        },
    )
    produce_raw(app_config.kafka.bootstrap_servers, app_config.kafka.topic, [(b"k", b"{bad")])
    docs = [(1, "a", "delta lake merge"), (2, "b", "kafka streams kafka"), (3, "c", "spark sql")]
    spark.createDataFrame(docs, DOCS).write.format("delta").mode("append").save(path)
    with running(spark, app_config):  # one snapshot of version 1 for each job
        for key in (copy, text_job):
            wait_for_watermark(spark, app_config, key, 1)
    config = kernel_config(app_config, tmp_path / "notebook.toml")
    key = 'ACCOUNT, DATABASE, TABLE, JOB = 2, "kb", "docs", '

    overview = execute(kernel, "state_overview", f'CONFIG = "{config}"')
    assert plots(overview) == [True] * 5
    assert "2 live job(s)" in text(overview) and "1 reject(s)" in text(overview)

    detail = execute(kernel, "job_detail", f'CONFIG = "{config}"\n{key}"copy"')
    assert plots(detail) == [True]
    assert re.search(r"job \d+: completed, watermark 1", text(detail)), text(detail)

    found = execute(
        kernel, "search", f'CONFIG = "{config}"\n{key}"text"\nQUERY, LIMIT = "kafka", 10'
    )
    assert plots(found) == [True]
    # one document holds "kafka": one row, id 2
    (results,) = [c for c in found.cells if c.source.rstrip().endswith("\nresults")]
    (shown,) = [o["data"]["text/plain"] for o in results.outputs if "data" in o]
    rows = [line.split() for line in shown.strip().splitlines()]
    assert [row[:2] for row in rows] == [["id", "score"], ["0", "2"]], shown
