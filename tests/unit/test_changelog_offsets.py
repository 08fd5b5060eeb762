"""Knowing a micro-batch holds no change log record from the offset log alone."""

from __future__ import annotations

import json
from pathlib import Path

from lakeprop.service.stream import ChangelogOffsets
from lakeprop.tables.hadoop import LocalFiles

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})


def write(checkpoint: Path, batch_id: int, kafka: dict[str, dict[str, int]], tick: int) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", META, json.dumps(kafka), json.dumps({"offset": tick, "timestamp": tick})]
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(lines))


def test_equal_change_log_offsets_mean_an_empty_batch_and_anything_else_does_not(
    tmp_path: Path,
) -> None:
    offsets = ChangelogOffsets(LocalFiles(), str(tmp_path), "log")
    write(tmp_path, 0, {"log": {"0": 1, "1": 0}}, 1)
    write(tmp_path, 1, {"log": {"0": 1, "1": 0}}, 2)  # only the tick moved
    write(tmp_path, 2, {"log": {"0": 1, "1": 3}}, 3)  # three messages on partition 1
    write(tmp_path, 3, {"log": {"0": 1, "1": 3}}, 4)
    write(tmp_path, 5, {"log": {"0": 1, "1": 3}}, 6)  # batch 4's file is gone
    write(tmp_path, 6, {"other": {"0": 1}}, 7)  # not the change log's topic
    write(tmp_path, 7, {"other": {"0": 1}}, 8)
    assert [offsets.empty(b) for b in range(9)] == [
        False,  # the first batch has no predecessor to compare with
        True,
        False,
        True,
        False,  # no file for batch 4
        False,  # no file for its predecessor
        False,
        False,  # equal, but not the topic's offsets
        False,  # no file at all
    ]


def test_a_malformed_offset_file_is_never_taken_for_an_empty_batch(tmp_path: Path) -> None:
    offsets = ChangelogOffsets(LocalFiles(), str(tmp_path), "log")
    write(tmp_path, 0, {"log": {"0": 1}}, 1)
    (tmp_path / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"log": {"0": 1')
    assert offsets.empty(1) is False
