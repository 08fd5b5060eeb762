"""Validation and quoting of identifiers that reach SQL.

Names arrive in change log messages written by users. Only plain identifiers
are accepted (letters, digits, underscore; not starting with a digit; at most
128 characters), and every one that is put into SQL text is back-quoted too, so
validation and quoting each suffice on their own.
"""

from __future__ import annotations

import re

from lakeprop.errors import InvalidIdentifierError

MAX_LENGTH = 128
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def validate_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a plain identifier, else raise naming ``what``."""
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdentifierError(f"{what} must not be empty")
    if len(value) > MAX_LENGTH:
        raise InvalidIdentifierError(f"{what} is longer than {MAX_LENGTH} characters")
    if not _IDENTIFIER.fullmatch(value):
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise InvalidIdentifierError(
            f"{what} {shown!r} is not a valid identifier "
            "(letters, digits and underscores, not starting with a digit)"
        )
    return value


def quote(identifier: str) -> str:
    """Back-quote an identifier for Spark SQL (after validation)."""
    return "`" + validate_identifier(identifier, "identifier").replace("`", "``") + "`"


def qualified(*parts: str) -> str:
    """`a`.`b`.`c` from validated parts."""
    return ".".join(quote(p) for p in parts)
