"""``auto_cdc``: change events applied by sequence, as SCD type 1 or 2 tables.

AUTO CDC (formerly APPLY CHANGES INTO) for open-source Spark and Delta. The
source is a table of change events (``source_kind: "events"``: one row per
insert, update or delete, with a sequence), or an ordinary table whose Change
Data Feed is the event stream (``"table"``). Whatever order the events arrive
in, split across commits and iterations, the target equals applying them all
sorted by sequence: late events land in their place, identical duplicates
count once, and a delete is remembered against late events for
``tombstone_retention``. See the consumer guide in the docs for the options,
the tables it keeps next to the target, and how it differs from Databricks'.

The work is in :mod:`.events` (validated, distinct events), :mod:`.scd1` and
:mod:`.scd2` (applying them), and :mod:`.schema` (the target's schema
following the source's).
"""

from __future__ import annotations

from lakeprop.consumers.auto_cdc.consumer import (
    EVENTS,
    QUARANTINE,
    TOMBSTONES,
    AutoCdcConsumer,
    sql_ref,
)

__all__ = ["EVENTS", "QUARANTINE", "TOMBSTONES", "AutoCdcConsumer", "sql_ref"]
