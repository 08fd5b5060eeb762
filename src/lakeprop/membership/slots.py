"""Which ownership slot a source table hashes onto.

All jobs of one table share its iterations, so a table, not a job, is what an
instance owns. The hash is of the table's name as jobs spell it, stable across
processes and Python versions (BLAKE2b, not ``hash()``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping


def slot_of(database: str, table: str, slots: int) -> int:
    """The slot, in ``[0, slots)``, that the table ``database.table`` hashes onto."""
    name = f"{database}\x00{table}".encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "big") % slots


def tables_by_slot(
    tables: Iterable[tuple[str, str]], slots: int
) -> dict[int, list[tuple[str, str]]]:
    """The tables grouped by slot (slots with no table left out)."""
    grouped: dict[int, list[tuple[str, str]]] = {}
    for database, table in tables:
        grouped.setdefault(slot_of(database, table, slots), []).append((database, table))
    return grouped


def owned_tables(
    held: Iterable[int], by_slot: Mapping[int, list[tuple[str, str]]]
) -> list[tuple[str, str]]:
    """The tables of the slots ``held``."""
    return sorted(t for slot in held for t in by_slot.get(slot, []))
