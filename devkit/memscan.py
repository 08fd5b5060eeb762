"""A scan of tables held in memory: the state reader's queries without Spark or
delta-rs, for unit tests (:class:`lakeprop.client.scans.Scan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lakeprop.client.scans import Query, Row


@dataclass
class MemoryScan:
    """Tables by path: their rows, and a version that grows with each write."""

    tables: dict[str, list[Row]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    def write(self, path: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append ``rows`` to the table at ``path`` (created if missing): one commit."""
        self.tables.setdefault(path, []).extend(dict(r) for r in rows)
        self.versions[path] = self.versions.get(path, -1) + 1

    def version(self, path: str) -> int | None:
        return self.versions.get(path)

    def rows(self, path: str, query: Query) -> list[Row]:
        return query.in_memory(self.tables.get(path, []))
