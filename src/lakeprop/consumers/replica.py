"""``replica``: a Delta copy of chosen columns of the source, keyed by primary key.

Options::

    {"primary_key": ["id"],            # required, one or more source columns
     "columns": ["id", "name"],        # optional, defaults to all columns
     "target_database": "replicas",    # optional, defaults to the source database
     "target_table": "orders_copy"}    # optional, defaults to <table>_<job name>
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeprop.consumers import ConsumerType, InvalidConsumerOptionsError
from lakeprop.errors import InvalidIdentifierError
from lakeprop.identifiers import validate_identifier

_ALLOWED = {"primary_key", "columns", "target_database", "target_table"}


def _identifier_list(value: object, what: str, *, required: bool) -> list[str] | None:
    if value is None:
        if required:
            raise InvalidConsumerOptionsError(f"replica option {what} is required")
        return None
    if not isinstance(value, list) or not value:
        raise InvalidConsumerOptionsError(
            f"replica option {what} must be a non-empty list of column names"
        )
    names = [validate_identifier(v, f"replica option {what} entry") for v in value]
    if len({n.lower() for n in names}) != len(names):
        raise InvalidConsumerOptionsError(f"replica option {what} lists a column twice")
    return names


def validate_options(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - _ALLOWED)
    if unknown:
        raise InvalidConsumerOptionsError(
            f"replica has unknown option(s) {unknown}; allowed: {sorted(_ALLOWED)}"
        )
    try:
        primary_key = _identifier_list(options.get("primary_key"), "primary_key", required=True)
        columns = _identifier_list(options.get("columns"), "columns", required=False)
        out: dict[str, Any] = {"primary_key": primary_key, "columns": columns}
        for name in ("target_database", "target_table"):
            value = options.get(name)
            out[name] = None if value is None else validate_identifier(value, f"replica {name}")
    except InvalidIdentifierError as exc:
        raise InvalidConsumerOptionsError(str(exc)) from None
    assert primary_key is not None
    if columns is not None:
        missing = [c for c in primary_key if c.lower() not in {x.lower() for x in columns}]
        if missing:
            raise InvalidConsumerOptionsError(
                f"replica option columns must include the primary key column(s) {missing}"
            )
    return out


def source_columns(options: Mapping[str, Any]) -> list[str]:
    return list(options["primary_key"]) + [
        c for c in (options.get("columns") or []) if c not in options["primary_key"]
    ]


CONSUMER_TYPE = ConsumerType(
    name="replica", validate_options=validate_options, source_columns=source_columns
)
