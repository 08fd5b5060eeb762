"""Least and greatest key values of a change set, by which a MERGE skips target files."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql.types import DataType, DateType, DecimalType, IntegralType, StringType

Bounds = Mapping[str, tuple[Any, Any]]
"""Least and greatest value of some key columns (lower-case names) in a change set."""


def boundable(data_type: DataType) -> bool:
    """Whether a key column of this type gets bounds: integers, decimals, dates and
    binary-collated strings, whose values come back from Spark to Python and go
    in again as literals unchanged (no time zone, no rounding, no collation)."""
    if isinstance(data_type, StringType):
        return getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(data_type, (IntegralType, DecimalType, DateType))


def bounds_after(per_version: Mapping[int, Bounds], after: int) -> dict[str, tuple[Any, Any]]:
    """The bounds of the changes of the versions after ``after``, from each
    version's bounds; a column all NULL there has none."""
    lows: dict[str, list[Any]] = {}
    highs: dict[str, list[Any]] = {}
    for version, bounds in per_version.items():
        if version <= after:
            continue
        for column, (low, high) in bounds.items():
            if low is not None:
                lows.setdefault(column, []).append(low)
            if high is not None:
                highs.setdefault(column, []).append(high)
    return {c: (min(lows[c]), max(highs[c])) for c in lows if c in highs}


def bounded_columns(columns: Iterable[str], types: Mapping[str, DataType]) -> list[str]:
    """The change set's names of ``columns`` (matched ignoring case) that get bounds,
    each once, in order."""
    named = {name.lower(): name for name in types}
    out: list[str] = []
    for column in columns:
        name = named.get(column.lower())
        if name is not None and name not in out and boundable(types[name]):
            out.append(name)
    return out
