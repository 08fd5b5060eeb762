"""The docs' benchmarks page and its plots, from the committed results files.

``python -m bench.report`` reads every ``bench/results/*.jsonl`` record
(:mod:`bench.results`) and writes ``docs/benchmarks.md`` and the plots under
``docs/assets/bench/``:

* per benchmark, what it measures and against what (its module's docstring),
  and a table of its latest figures at the default size on each stack measured,
  lakeprop beside the baseline, with the target where one is set;
* how a tick's cost grows with the number of jobs (``scale`` at every size run);
* lakeprop against its baseline per benchmark (the ratio of the headline figure).

Nothing in the page is typed by hand: ``tests/unit/test_docs.py`` fails when it
differs from what the results give.
"""

from __future__ import annotations

import argparse
import inspect
import io
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import (  # noqa: E402
    auto_cdc,
    catchup,
    chain,
    failover,
    fairness,
    fanout,
    join,
    latency,
    many,
    membership,
    object_storage,
    pinned,
    recent,
    registration,
    results,
    rolling,
    scale,
    scale_out,
    small_tail,
    spark_jobs,
    throughput,
    vectors,
)

PAGE = ROOT / "docs" / "benchmarks.md"
ASSETS = ROOT / "docs" / "assets" / "bench"
SECTIONS = (
    *((m.TITLE, m) for m in (scale, registration, many, latency, small_tail, throughput)),
    *((m.TITLE, m) for m in (fanout, catchup, recent, fairness)),
    (f"{auto_cdc.TITLE} scd1", auto_cdc),
    (f"{auto_cdc.TITLE} scd1 vs a plain target", auto_cdc),
    (f"{auto_cdc.TITLE} scd2", auto_cdc),
    (vectors.TITLE, vectors),
    (membership.TITLE, membership),
    (failover.TITLE, failover),
    (rolling.TITLE, rolling),
    (scale_out.TITLE, scale_out),
    (pinned.TITLE, pinned),
    (object_storage.TITLE, object_storage),
    (chain.TITLE, chain),
    (spark_jobs.TITLE, spark_jobs),
    (join.TITLE, join),
)
"""The benchmarks in the order the page shows them: (name in the results, module)."""

HEADLINE = {
    "scale": "tick p50",
    "registration": "registrations applied",
    "latency": "commit to sink p50",
    "fan-out": "time to every replica in step",
    "catch-up": "catch-up time",
    "recent keys": "tail time",
    "fairness": "other account's first sync",
    "auto cdc scd1": "commit applied p50",
    "small tail": "one-row tail",
    "many": "trickle commit to sink p50",
    "auto cdc scd2": "commit applied p50",
    "vector index": "search p50, warm",
}
"""The figure each benchmark is summed up by in the comparison plot."""

TARGETS = {
    ("scale", "tick p50"): "< 0.5 s at 1,000 jobs",
    ("scale", "tick p95"): "< 2 s at 10,000 jobs; < 2 s at 100,000 with notifications",
    ("scale", "Spark jobs in selection"): "0",
    ("registration", "registrations applied"): "≥ 1,000 per s at 100,000 jobs",
    ("latency", "commit to sink p50"): "≤ 1.2 s (native path)",
    ("latency", "commit to sink p95"): "≤ 2 s (native path)",
    ("fan-out", "time vs DIY"): "≤ 0.30 native, ≤ 1.0 on Spark",
    ("catch-up", "speed vs plain MERGE"): "≥ 0.8",
    ("auto cdc scd1", "speed vs DIY"): "≥ 1",
    ("small tail", "one-row tail"): "≤ 0.2 s",
    ("many", "idle file-system operations on tables"): "0",
    ("object storage", "table requests per idle tick, notifications on"): "0",
    ("many", "trickle commit to sink p50"): "≤ 1.5 s",
    ("vector index", "recall@10 at the default nprobe"): "≥ 0.95",
    ("vector index", "digits recall@10, default"): "≥ 0.95",
    ("vector index", "recall@10 after 30 % updated, 10 % deleted"): "≥ 0.95",
    ("vector index", "search p50, warm"): "≤ 10 ms at 100,000 x 128; ≤ 50 ms at 1M",
    ("vector index", "search p95, warm"): "≤ 80 ms at 1M",
    **{
        ("membership", f"largest share over fair, 100 instances, {slots} slots"): "≤ 1.1"
        for slots in (256, 1024, 4096)
    },
    ("failover", "kill to first iteration of a moved table, p50"): "≤ session timeout + a tick",
    ("failover", "kill to first iteration of a moved table, p95"): "≤ 1.5 x (timeout + a tick)",
    ("rolling restart", "slots moved to another instance"): "0",
    ("rolling restart", "commit to its iteration's start, max"): "≤ a tick + the longest restart",
    ("scale-out", "catalog write conflicts, all instances"): "0",
    ("scale-out, pinned", "rate kept up with, two instances over one"): "≥ 1.8",
    ("chain", "end-to-end p50 / first step p50"): "≤ 1.5",
    ("chain", "end-to-end p50, five expectations (baseline: none)"): "≤ 1.1 x none",
    ("spark jobs", "replica tail"): "≤ the MERGE's + 1",
    ("spark jobs", "auto_cdc SCD 1 tail"): "≤ the MERGE's + 2",
    ("spark jobs", "auto_cdc SCD 2 tail"): "≤ the MERGE's + 2",
    **{
        ("join", f"1 % of {side}: tail / recompute, customers clustered"): "≤ 0.10"
        for side in ("orders", "customers")
    },
}
"""Targets the project set itself, shown beside the figures they apply to."""

UNITS = {"s": "s", "ms": "ms", "per_s": "/s", "MiB": "MiB", "count": "", "ratio": "x"}


def stack_label(stack: dict[str, Any]) -> str:
    """``PySpark 4.2.0, delta-spark 4.4.0``."""
    return f"PySpark {stack.get('pyspark')}, delta-spark {stack.get('delta_spark')}"


def _value(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    else:
        text = f"{value:,}"
    suffix = UNITS.get(unit, unit)
    return f"{text}{suffix}" if suffix == "x" else f"{text} {suffix}".strip()


Runs = dict[tuple[str, str, str], list[dict[str, Any]]]
"""The records of one run, by (benchmark, size, stack)."""


def latest_runs(records: Iterable[dict[str, Any]]) -> Runs:
    """The records of the latest run of each (benchmark, size, stack)."""
    runs: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = defaultdict(dict)
    for record in records:
        key = (record["benchmark"], record["size"], stack_label(record["stack"]))
        runs[key].setdefault(record["run_id"], []).append(record)
    return {key: by_run[max(by_run)] for key, by_run in runs.items()}


def _figure_table(title: str, runs: Runs, size: str = "default") -> list[str]:
    stacks = sorted(stack for (name, at, stack) in runs if name == title and at == size)
    if not stacks:
        return [f"Not yet measured at the {size} size."]
    per_stack = {s: {r["figure"]: r for r in runs[(title, size, s)]} for s in stacks}
    figures: list[str] = []
    for stack in stacks:
        figures += [f for f in per_stack[stack] if f not in figures]
    first = runs[(title, size, stacks[-1])][0]
    sizes = ", ".join(f"{k}={v}" for k, v in first["sizes"].items())
    lines = [
        f"Sizes: {sizes}. Baseline: {first['baseline_is'] or 'none (targets only)'}.",
        "",
        "| figure | " + " | ".join(stacks) + " | target |",
        "|---|" + "---|" * len(stacks) + "---|",
    ]
    for figure in figures:
        cells = []
        for stack in stacks:
            record = per_stack[stack].get(figure)
            if record is None:
                cells.append("-")
                continue
            cell = _value(record["lakeprop"], record["unit"])
            if record["baseline"] is not None:
                cell += f" (baseline {_value(record['baseline'], record['unit'])})"
            if not record["checks_passed"]:
                cell += " **checks failed**"
            cells.append(cell)
        lines.append(
            f"| {figure} | " + " | ".join(cells) + f" | {TARGETS.get((title, figure), '')} |"
        )
    runs_shown = sorted({runs[(title, size, s)][0]["at"][:10] for s in stacks})
    lines += ["", f"Measured on {', '.join(runs_shown)} ({first['machine']})."]
    return lines


def _summary(module: Any) -> str:
    doc = inspect.getdoc(module) or ""
    title, _, rest = doc.partition("\n\n")
    return f"{title.strip()}\n\n{rest.strip()}" if rest.strip() else title.strip()


def page(records: Sequence[dict[str, Any]], plots: Sequence[str]) -> str:
    runs = latest_runs(records)
    machines = sorted({r["machine"] for r in records})
    out = [
        "<!-- generated by `python -m bench.report` from bench/results: do not edit -->",
        "",
        "# Benchmarks",
        "",
        "Each benchmark runs lakeprop and the baseline a Spark user writes today side",
        "by side, in one process (one Spark session, one local Kafka broker), and checks",
        "that both produced the same tables; a figure whose checks failed is marked. The",
        "figures below are the latest run of each benchmark at its default size (and at",
        "its full size, where one was run) on each",
        "stack measured, read from the committed results files (`bench/results/`), one",
        "JSON record per figure with the stack's versions and the sizes. Run them with",
        "`make bench` (`SIZE=smoke|default|full`); `make bench-report` rewrites this page.",
        "",
        f"Machines: {', '.join(machines) or 'none yet'} (cores and memory; the local file",
        "system; Spark in local mode, driver and executors in one JVM).",
    ]
    if plots:
        out += ["", "## At a glance", ""]
        out += [f"![{alt}](assets/bench/{name})" for name, alt in _plot_titles(plots)]
    described: set[str] = set()
    for title, module in SECTIONS:
        out += ["", f"## {title}", ""]
        if module.__name__ not in described:
            out += [_summary(module), ""]
            described.add(module.__name__)
        out += _figure_table(title, runs)
        if any(name == title and size == "full" for name, size, _ in runs):
            out += ["", "At the full size:", "", *_figure_table(title, runs, "full")]
        if title == "scale":
            out += _scale_by_jobs(records)
    return "\n".join(out) + "\n"


SCALE_COLUMNS = (
    "tick p50",
    "tick p95",
    "selection p50",
    "results phase p50",
    "driver peak RSS",
)


def _scale_by_jobs(records: Sequence[dict[str, Any]]) -> list[str]:
    """The latest ``scale`` run with commit notifications at each job count, side by
    side (whatever size named it)."""
    latest: dict[tuple[str, int], str] = {}
    for r in records:
        if r["benchmark"] == "scale" and r["sizes"].get("notifications"):
            key = (stack_label(r["stack"]), int(r["sizes"]["jobs"]))
            latest[key] = max(latest.get(key, ""), r["run_id"])
    if not latest:
        return []
    cells: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    for r in records:
        key = (stack_label(r["stack"]), int(r["sizes"].get("jobs", 0)))
        if r["benchmark"] == "scale" and latest.get(key) == r["run_id"]:
            cells[key][r["figure"]] = _value(r["lakeprop"], r["unit"])
            cells[key]["ticks"] = str(r["sizes"]["ticks"])
    lines = [
        "",
        "With commit notifications, by job count (1 % of the tables changing per tick):",
        "",
        "| stack | jobs | ticks | " + " | ".join(SCALE_COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(SCALE_COLUMNS),
    ]
    for stack, jobs in sorted(cells):
        row = cells[(stack, jobs)]
        shown = " | ".join(row.get(c, "-") for c in SCALE_COLUMNS)
        lines.append(f"| {stack} | {jobs:,} | {row['ticks']} | {shown} |")
    return lines


def _plot_titles(plots: Sequence[str]) -> list[tuple[str, str]]:
    titles = {
        "tick-cost.png": "a tick's cost against the number of jobs",
        "vs-baseline.png": "lakeprop's headline figure over its baseline's, per benchmark",
    }
    return [(name, titles[name]) for name in plots]


def _tick_cost(records: Sequence[dict[str, Any]]) -> Any:
    """Tick p50 and p95 of ``scale`` against its jobs, one line per stack (latest run
    of each size)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    points: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    latest: dict[tuple[str, int, bool], str] = {}
    for r in records:
        if r["benchmark"] != "scale" or r["sizes"].get("notifications"):
            continue
        key = (stack_label(r["stack"]), int(r["sizes"]["jobs"]), False)
        if r["run_id"] >= latest.get(key, ""):
            latest[key] = r["run_id"]
    for r in records:
        if r["benchmark"] != "scale" or r["sizes"].get("notifications"):
            continue
        stack, jobs = stack_label(r["stack"]), int(r["sizes"]["jobs"])
        if r["run_id"] == latest[(stack, jobs, False)] and r["figure"] in ("tick p50", "tick p95"):
            points[stack].setdefault(jobs, {})[r["figure"]] = float(r["lakeprop"])
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for stack in sorted(points):
        jobs = sorted(points[stack])
        for figure, style in (("tick p50", "-o"), ("tick p95", "--s")):
            xs = [j for j in jobs if figure in points[stack][j]]
            ax.plot(xs, [points[stack][j][figure] for j in xs], style, label=f"{figure}, {stack}")
    ax.set_xscale("log")
    ax.set_xlabel("jobs (on jobs/5 tables, 1 % of the tables changing per tick)")
    ax.set_ylabel("whole foreachBatch, s")
    ax.set_title("A tick's cost against the number of jobs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _versus(records: Sequence[dict[str, Any]]) -> Any:
    """lakeprop / baseline of each benchmark's headline figure (default size), per stack."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    runs = latest_runs(records)
    bars: dict[str, dict[str, float]] = defaultdict(dict)
    for (title, size, stack), rows in runs.items():
        figure = HEADLINE.get(title)
        for r in rows:
            if size == "default" and r["figure"] == figure and r["baseline"]:
                bars[stack][title] = float(r["lakeprop"]) / float(r["baseline"])
    if not bars:
        return None
    titles = sorted({t for b in bars.values() for t in b})
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.5 * len(titles) * len(bars)), dpi=100)
    height = 0.8 / len(bars)
    for i, stack in enumerate(sorted(bars)):
        shown = [(n, bars[stack][t]) for n, t in enumerate(titles) if t in bars[stack]]
        ys = [n + i * height for n, _ in shown]
        # from 1 to the ratio, on a log scale: a 0.5 and a 2 are as far from even
        ax.barh(ys, [r - 1.0 for _, r in shown], height, left=1.0, label=stack)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([n + height * (len(bars) - 1) / 2 for n in range(len(titles))])
    ax.set_yticklabels([f"{t}: {HEADLINE[t]}" for t in titles], fontsize=8)
    ax.set_xlabel("lakeprop / baseline, log scale (below 1: lakeprop takes less)")
    ax.set_title("lakeprop against its baseline, default sizes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


PLOTS = {"tick-cost.png": _tick_cost, "vs-baseline.png": _versus}


def render(records: Sequence[dict[str, Any]]) -> tuple[str, dict[str, bytes]]:
    """The page's text and each plot's PNG bytes."""
    images: dict[str, bytes] = {}
    for name, draw in PLOTS.items():
        fig = draw(records)
        if fig is None:
            continue
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None})
        images[name] = buffer.getvalue()
        import matplotlib.pyplot as plt

        plt.close(fig)
    return page(records, list(images)), images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    text, images = render(list(results.load(args.results)))
    ASSETS.mkdir(parents=True, exist_ok=True)
    for name, data in images.items():
        (ASSETS / name).write_bytes(data)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} and {len(images)} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
