"""The docs' generated pages equal what the code and the committed results give."""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from bench import report, results
from devkit import reference
from lakeprop.config import AppConfig
from lakeprop.engine.ownership import SlotOwner
from lakeprop.errors import DESCRIPTIONS, ErrorCode
from lakeprop.service.metrics import (
    METRICS,
    AccountGauges,
    ClusterGauges,
    JobGauges,
    QueryProgress,
    ServiceMetrics,
)
from tests.unit.test_membership import Clock, _seat

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_a_reference_page_is_what_the_code_gives(page: str) -> None:
    path = reference.REFERENCE / page
    assert path.read_text() == reference.PAGES[page](), (
        f"{path.relative_to(ROOT)} is stale: run python -m devkit.reference"
    )


def test_every_setting_has_a_description() -> None:
    config = AppConfig()
    sections = [type(getattr(config, f.name)) for f in fields(config)]
    missing = [
        f"{section.__name__}.{f.name}"
        for section in [AppConfig, *(s for s in sections if is_dataclass(s))]
        for f in fields(section)
        if not is_dataclass(getattr(config, f.name, None))
        and f.name not in reference.field_docs(section)
    ]
    assert missing == []


def test_every_error_code_has_a_description() -> None:
    assert set(DESCRIPTIONS) == set(ErrorCode)


def test_the_metrics_exported_are_the_metrics_defined() -> None:
    metrics = ServiceMetrics()
    QueryProgress(metrics.registry, "q")
    metrics.registry.register(AccountGauges(dict))
    metrics.registry.register(JobGauges(dict, lambda table: None, lambda table, version: None))
    metrics.registry.register(ClusterGauges(SlotOwner(_seat(Clock())), list))
    exported = {family.name for family in metrics.registry.collect()}
    assert exported == {m.name for m in METRICS}


def test_the_benchmarks_page_and_its_plots_are_what_the_results_give() -> None:
    text, images = report.render(list(results.load()))
    assert report.PAGE.read_text() == text, "docs/benchmarks.md is stale: run make bench-report"
    for name, data in images.items():
        assert (report.ASSETS / name).read_bytes() == data, f"plot {name} is stale"
    assert sorted(re.findall(r"assets/bench/([\w.-]+\.png)", text)) == sorted(images)


def test_no_page_points_at_what_a_reader_cannot_see() -> None:
    pattern = re.compile(r"\b(seed [0-9]{3}|issue [0-9]+|next issue|the mission)\b", re.IGNORECASE)
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
        for match in pattern.finditer(path.read_text())
    ]
    assert found == []


def test_the_development_page_names_every_module_in_its_package_row() -> None:
    """The package map of docs/development.md shows the rooms the code has."""
    page = (ROOT / "docs" / "development.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in page.splitlines()
        if line.startswith("| `") or line.startswith("| top level")
    }
    package = ROOT / "src" / "lakeprop"
    missing = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if path.name == "__init__.py":
            continue
        room = f"{parts[0]}/" if len(parts) > 1 and f"{parts[0]}/" in rows else "top level"
        row = rows.get(room, "")
        if path.stem not in row:
            missing.append(str(path.relative_to(package)))
    assert missing == []
