"""Checks shared by the consumers' options: unknown keys, column lists, targets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeprop.errors import InvalidConsumerOptionsError
from lakeprop.identifiers import validate_identifier

CHANGE_FEED = "change_feed"
"""The option that turns a table target's change feed off (``false``); on by default,
so that other jobs can read the target as their source."""
TARGET_OPTIONS = frozenset({"target_database", "target_table", CHANGE_FEED})


def reject_unknown_options(consumer: str, options: Mapping[str, Any], allowed: set[str]) -> None:
    """Raise naming the options a consumer type does not know."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidConsumerOptionsError(
            f"{consumer} has unknown option(s) {unknown}; allowed: {sorted(allowed)}"
        )


def identifier_list(value: object, consumer: str, what: str) -> list[str]:
    """A required, non-empty list of distinct column names."""
    if value is None:
        raise InvalidConsumerOptionsError(f"{consumer} option {what} is required")
    if not isinstance(value, list) or not value:
        raise InvalidConsumerOptionsError(
            f"{consumer} option {what} must be a non-empty list of column names"
        )
    names = [validate_identifier(v, f"{consumer} option {what} entry") for v in value]
    if len({n.lower() for n in names}) != len(names):
        raise InvalidConsumerOptionsError(f"{consumer} option {what} lists a column twice")
    return names


def target_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The optional target_database / target_table options, validated, and
    ``change_feed`` where given (absent means on: an option added later must not
    change the options, and so the write identity, of jobs registered before)."""
    names = {
        name: None if options.get(name) is None else validate_identifier(options[name], name)
        for name in ("target_database", "target_table")
    }
    if CHANGE_FEED not in options:
        return names
    if not isinstance(options[CHANGE_FEED], bool):
        raise InvalidConsumerOptionsError(
            f"option {CHANGE_FEED} must be true or false, got {options[CHANGE_FEED]!r}"
        )
    return {**names, CHANGE_FEED: options[CHANGE_FEED]}
