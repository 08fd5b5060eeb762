"""Small files by location: which backend a location takes, and local file access."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakeprop.tables.hadoop import LocalFiles, local_path


@pytest.mark.parametrize(
    ("location", "path"),
    [
        ("/data/x", "/data/x"),
        ("relative/x", "relative/x"),
        ("file:/data/x", "/data/x"),
        ("file:///data/x", "/data/x"),
        ("s3a://bucket/x", None),
        ("abfss://c@acct.dfs.core.windows.net/x", None),
        ("dbfs:/x", None),
        ("hdfs://nn:8020/x", None),
    ],
)
def test_local_locations_are_told_from_remote_ones(location: str, path: str | None) -> None:
    assert local_path(location) == path


def test_local_files(tmp_path: Path) -> None:
    files = LocalFiles()
    log = f"file://{tmp_path}/_delta_log"
    assert files.names(log) == [] and not files.exists(f"{log}/0.json")
    (tmp_path / "_delta_log").mkdir()
    files.write_text(f"{log}/0.json", "one\ntwo\n")
    assert files.exists(f"{tmp_path}/_delta_log/0.json")
    assert list(files.lines(f"{log}/0.json")) == ["one", "two"]
    assert files.read_text(f"{log}/0.json") == "one\ntwo\n"
    assert files.names(log) == ["0.json"]
    files.delete(f"{log}/0.json")
    assert files.read_text(f"{log}/0.json") is None and list(files.lines(f"{log}/0.json")) == []
