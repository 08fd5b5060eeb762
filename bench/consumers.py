"""A consumer that writes nothing, for measuring the engine's own cost at scale."""

from __future__ import annotations

from pyspark.sql import DataFrame

from lakeprop.consumers import Consumer


class NullConsumer(Consumer):
    """Reads nothing beyond the shared change set and writes nothing."""

    def snapshot(self, rows: DataFrame, version: int) -> int:
        return 0

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        return 0
