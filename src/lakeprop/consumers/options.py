"""Checks shared by the consumers' options: unknown keys, column lists, targets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeprop.errors import InvalidConsumerOptionsError
from lakeprop.identifiers import validate_identifier

TARGET_OPTIONS = frozenset({"target_database", "target_table"})


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


def target_options(options: Mapping[str, Any]) -> dict[str, str | None]:
    """The optional target_database / target_table options, validated."""
    return {
        name: None if options.get(name) is None else validate_identifier(options[name], name)
        for name in sorted(TARGET_OPTIONS)
    }
