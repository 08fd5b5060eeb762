"""``secondary_index``: an index table from one or more columns to the primary key.

Options::

    {"columns": ["customer_id"],        # required: the indexed column(s)
     "primary_key": ["order_id"],       # required: the source's primary key
     "target_database": "idx",          # optional, defaults to the source database
     "target_table": "orders_by_cust"}  # optional, defaults to <table>_<job name>

The index holds one entry per source row: the indexed columns first (Delta
collects file statistics on leading columns, so lookups by them skip files),
then the key columns. It is kept exact under inserts, deletes and updates that
change an indexed value: entries are maintained per primary key, so the old
entry of an updated row is replaced, not left behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeprop.consumers.options import (
    TARGET_OPTIONS,
    identifier_list,
    reject_unknown_options,
    target_options,
)
from lakeprop.consumers.replica import ReplicaConsumer
from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError


def index_columns(options: Mapping[str, Any]) -> list[str]:
    """Indexed columns, then the key columns not already among them."""
    indexed = list(options["columns"])
    lowered = {c.lower() for c in indexed}
    return indexed + [k for k in options["primary_key"] if k.lower() not in lowered]


class SecondaryIndexConsumer(ReplicaConsumer):
    """A replica of the indexed and key columns, maintained per primary key."""

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        allowed = {"columns", "primary_key", *TARGET_OPTIONS}
        reject_unknown_options("secondary_index", options, allowed)
        try:
            out: dict[str, Any] = {
                "columns": identifier_list(options.get("columns"), "secondary_index", "columns"),
                "primary_key": identifier_list(
                    options.get("primary_key"), "secondary_index", "primary_key"
                ),
            }
            out.update(target_options(options))
        except InvalidIdentifierError as exc:
            raise InvalidConsumerOptionsError(f"secondary_index: {exc}") from None
        return out

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        return index_columns(options)

    def target_columns(self) -> list[str]:
        return index_columns(self.context.options)
