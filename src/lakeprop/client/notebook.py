"""What the notebooks in ``notebooks/`` share: a session, the service's state as
pandas frames, and the plots.

On Databricks the notebook's ``spark`` exists and is used. Elsewhere
:func:`open_notebook` builds a session from the service's config: the path it is
given, else ``$LAKEPROP_CONFIG``, else ``conf/local.toml`` found from the working
directory upwards (Jupyter starts notebooks in ``notebooks/``). Needs the
``notebooks`` extra (pandas, matplotlib).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, load_config
from lakeprop.errors import InvalidConfigError, LakepropError
from lakeprop.spec import JobKey
from lakeprop.state import store as state
from lakeprop.state.store import EVENTS_TABLE, HISTORY_TABLE, REJECTS_TABLE, REQUESTS_TABLE

LOCAL_CONFIG = Path("conf") / "local.toml"


def find_config(start: Path | None = None) -> Path:
    """``$LAKEPROP_CONFIG``, else ``conf/local.toml`` in ``start`` or a parent of it."""
    if os.environ.get("LAKEPROP_CONFIG"):
        return Path(os.environ["LAKEPROP_CONFIG"])
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / LOCAL_CONFIG).is_file():
            return directory / LOCAL_CONFIG
    raise InvalidConfigError(
        f"no config given, $LAKEPROP_CONFIG is not set and no {LOCAL_CONFIG} was found "
        f"in {here} or above: pass open_notebook('path/to/config.toml')"
    )


@dataclass
class Notebook:
    """The service's state, read for a person: one frame per question."""

    spark: SparkSession
    config: AppConfig
    client: LakepropClient

    def _table(self, name: str) -> Any:
        return state.read_table(self.spark, self.config.state.table_path(name))

    def jobs(self, include_dropped: bool = False) -> pd.DataFrame:
        """One row per job: its key, state, watermark, the source's latest version,
        the lag between them, and its last error."""
        jobs = self.client.list_jobs(include_dropped=include_dropped)
        latest: dict[tuple[str, str], int | None] = {}
        for name in {(j.key.database, j.key.table) for j in jobs}:
            try:
                latest[name] = self.client.source_version(*name)
            except LakepropError:
                latest[name] = None
        rows = []
        for j in jobs:
            source = latest[(j.key.database, j.key.table)]
            rows.append(
                {
                    "account": j.key.account_id,
                    "database": j.key.database,
                    "table": j.key.table,
                    "job": j.key.job_name,
                    "job_id": j.job_id,
                    "label": f"{j.key.account_id}/{j.key.database}.{j.key.table}/{j.key.job_name}",
                    "consumer": j.spec["iteration"]["consumer"]["type"],
                    "state": j.state,
                    "watermark": j.watermark,
                    "latest": source,
                    "lag": None
                    if source is None or j.watermark is None
                    else max(0, source - j.watermark),
                    "error_code": j.status.get("error_code") or 0,
                    "error_msg": j.status.get("error_msg") or "",
                    "create_at": j.create_at,
                    "drop_at": j.drop_at,
                }
            )
        return pd.DataFrame(rows, columns=JOB_COLUMNS)

    def iterations(self) -> pd.DataFrame:
        """One row per job of every iteration, oldest first, with its duration."""
        history = self._table(HISTORY_TABLE)
        members = history.select(*ITERATION_FIELDS, F.explode("members").alias("m"))
        rows = members.select(
            *ITERATION_FIELDS, *(F.col(f"m.{f}").alias(name) for name, f in MEMBER_FIELDS.items())
        )
        frame = pd.DataFrame([r.asDict() for r in rows.collect()], columns=ITERATION_COLUMNS)
        frame["duration_s"] = (frame["ended_at"] - frame["started_at"]).dt.total_seconds()
        return frame.sort_values("ended_at", ignore_index=True)

    def requests(self) -> pd.DataFrame:
        """The verdict on every change log message, oldest first."""
        return self._by_log_time(self._table(REQUESTS_TABLE))

    def rejects(self) -> pd.DataFrame:
        """The rejected change log messages with their reasons, oldest first."""
        return self._by_log_time(self._table(REJECTS_TABLE).drop("payload"))

    def events(
        self,
        kind: str | None = None,
        *,
        job: JobKey | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = 1000,
    ) -> pd.DataFrame:
        """The event table (iterations, job errors, expectation counts, verdicts),
        oldest first: ``kind`` keeps one kind, ``job`` one job's events (its
        verdicts, errors and rule counts; an iteration's own row is its table's),
        ``since`` and ``until`` a time range (``until`` excluded; naive times, as
        the service's clock writes them); ``limit`` keeps the newest that many
        (None: all). The filters reach the Delta scan, so that files of other
        times are skipped."""
        events = self._table(EVENTS_TABLE)
        conditions = []
        if kind is not None:
            conditions.append(F.col("kind") == kind)
        if job is not None:
            conditions += [
                F.col("account_id") == job.account_id,
                F.col("database") == job.database,
                F.col("table") == job.table,
                F.col("job_name") == job.job_name,
            ]
        if since is not None:
            conditions.append(F.col("at") >= F.lit(since))
        if until is not None:
            conditions.append(F.col("at") < F.lit(until))
        for condition in conditions:
            events = events.where(condition)
        if limit is not None:
            events = events.orderBy(F.col("at").desc()).limit(limit)
        frame = pd.DataFrame([r.asDict() for r in events.collect()], columns=events.columns)
        return frame.sort_values("at", ignore_index=True)

    @staticmethod
    def _by_log_time(df: Any) -> pd.DataFrame:
        frame = pd.DataFrame([r.asDict() for r in df.collect()], columns=df.columns)
        return frame.sort_values("log_timestamp", ignore_index=True)

    def job(self, key: JobKey) -> dict[str, Any]:
        """One job's spec and status, as the client reads them."""
        info = self.client.get_job_status(key)
        if info is None:
            raise LakepropError(f"no job {key}")
        return {
            "job_id": info.job_id,
            "state": info.state,
            "watermark": info.watermark,
            "spec": info.spec,
            "status": info.status,
        }


JOB_COLUMNS = [
    "account",
    "database",
    "table",
    "job",
    "job_id",
    "label",
    "consumer",
    "state",
    "watermark",
    "latest",
    "lag",
    "error_code",
    "error_msg",
    "create_at",
    "drop_at",
]
ITERATION_FIELDS = [
    "iteration_id",
    "account_id",
    "database",
    "table",
    "kind",
    "from_version",
    "to_version",
    "rows_read",
    "started_at",
    "ended_at",
    "outcome",
]
MEMBER_FIELDS = {
    "job_id": "job_id",
    "job": "job_name",
    "consumer": "consumer_type",
    "rows_written": "rows_written",
    "error_code": "error_code",
    "error_msg": "error_msg",
}
"""Columns of :meth:`Notebook.iterations`: the iteration's, then its member's (named
here as in the other frames)."""
ITERATION_COLUMNS = [*ITERATION_FIELDS, *MEMBER_FIELDS]


def open_notebook(
    config: str | Path | None = None,
    spark: SparkSession | None = None,
    overrides: dict[str, str] | None = None,
) -> Notebook:
    """The notebook's view of one service: its config, a session and a client."""
    app_config = load_config(config or find_config(), overrides)
    if spark is None:
        spark = SparkSession.getActiveSession()
    if spark is None:
        from lakeprop.session import build_session, client_spark_config

        spark = build_session(client_spark_config(app_config.spark))
        spark.sparkContext.setLogLevel("ERROR")
    client = LakepropClient(app_config.kafka, app_config.state, spark, tables=app_config.tables)
    return Notebook(spark, app_config, client)


# -- plots: each draws on ``ax`` (a new figure without one) and says so when empty ------


def _axes(ax: Axes | None, size: tuple[float, float] = (9, 4)) -> Axes:
    if ax is not None:
        return ax
    _, new = plt.subplots(figsize=size)
    return new


def _times(ax: Axes) -> None:
    """Clock times on the x axis, slanted so they do not overlap."""
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]
    ax.tick_params(axis="x", labelrotation=30)


def plot_nothing(ax: Axes, what: str) -> Axes:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return ax


def plot_jobs_by_state(jobs: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Live jobs per account, stacked by state."""
    ax = _axes(ax)
    live = jobs[jobs["drop_at"].isna()]
    if live.empty:
        return plot_nothing(ax, "jobs")
    counts = live.groupby(["account", "state"]).size().unstack(fill_value=0)
    counts.plot.bar(stacked=True, ax=ax, rot=0)
    ax.set(title="Jobs by state and account", xlabel="account", ylabel="jobs")
    return ax


def plot_lag(jobs: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Source versions each live job is behind, most behind first."""
    ax = _axes(ax)
    known = jobs[jobs["drop_at"].isna() & jobs["lag"].notna()]
    if known.empty:
        return plot_nothing(ax, "job with a watermark")
    ordered = known.sort_values("lag")
    ax.barh(ordered["label"], ordered["lag"].astype(float))
    ax.set(title="Lag per job", xlabel="source versions behind")
    return ax


def plot_iterations(iterations: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Each iteration when it ended, its duration, and (by size) the rows it read."""
    ax = _axes(ax)
    runs = iterations.drop_duplicates("iteration_id")
    if runs.empty:
        return plot_nothing(ax, "iterations")
    biggest = max(1.0, float(runs["rows_read"].max()))
    for kind, group in runs.groupby("kind"):
        sizes = 20 + 200 * group["rows_read"].astype(float) / biggest
        ax.scatter(group["ended_at"], group["duration_s"], s=sizes, label=str(kind), alpha=0.6)
    ax.set(title="Iterations: duration, rows read (size)", xlabel="ended", ylabel="seconds")
    _times(ax)
    ax.legend()
    return ax


def plot_errors_and_rejects(
    iterations: pd.DataFrame, rejects: pd.DataFrame, ax: Axes | None = None, freq: str = "1min"
) -> Axes:
    """Failed job runs and rejected log messages per ``freq``."""
    ax = _axes(ax)
    failed = iterations.loc[iterations["error_code"] != 0, "ended_at"]
    series = {
        "job errors": failed.dt.floor(freq).value_counts(),
        "rejects": rejects["log_timestamp"].dt.floor(freq).value_counts()
        if len(rejects)
        else pd.Series(dtype=int),
    }
    counts = pd.DataFrame(series).fillna(0).sort_index()
    if counts.empty:
        return plot_nothing(ax, "errors or rejects")
    counts.index = counts.index.strftime("%H:%M")
    counts.plot.bar(ax=ax, rot=45)
    ax.set(title=f"Errors and rejects per {freq}", xlabel="time", ylabel="count")
    return ax


def plot_slowest_jobs(iterations: pd.DataFrame, ax: Axes | None = None, top: int = 10) -> Axes:
    """The ``top`` jobs by total iteration time."""
    ax = _axes(ax)
    if iterations.empty:
        return plot_nothing(ax, "iterations")
    totals = iterations.groupby("job")["duration_s"].sum().nlargest(top).sort_values()
    ax.barh(totals.index.astype(str), totals.to_numpy())
    ax.set(title=f"Slowest jobs (top {top}, total iteration time)", xlabel="seconds")
    return ax


def plot_job_progress(runs: pd.DataFrame, latest: int | None, ax: Axes | None = None) -> Axes:
    """One job's watermark over time (its successful iterations), and the source's
    latest version now."""
    ax = _axes(ax)
    done = runs[runs["error_code"] == 0].sort_values("ended_at")
    if done.empty:
        return plot_nothing(ax, "successful iteration")
    ax.step(done["ended_at"], done["to_version"], where="post", marker="o", label="watermark")
    if latest is not None:
        ax.axhline(latest, color="grey", linestyle="--", label=f"source now ({latest})")
    ax.set(title="Watermark over time", xlabel="time", ylabel="source version")
    _times(ax)
    ax.legend()
    return ax


def pretty(value: Any) -> str:
    """A spec or status, as indented JSON."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)
