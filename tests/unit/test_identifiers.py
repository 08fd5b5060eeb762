"""Identifiers that reach SQL are validated and quoted."""

from __future__ import annotations

import pytest

from lakeprop.errors import InvalidIdentifierError
from lakeprop.identifiers import qualified, quote, validate_identifier


@pytest.mark.parametrize("name", ["a", "_x", "Orders_2024", "a" * 128])
def test_valid(name: str) -> None:
    assert validate_identifier(name, "n") == name
    assert quote(name) == f"`{name}`"


@pytest.mark.parametrize(
    "name", ["", "1abc", "a b", "a-b", "a`b", "t; DROP TABLE x", "ä", "a" * 129, "a.b", None, 5]
)
def test_invalid(name: object) -> None:
    with pytest.raises(InvalidIdentifierError, match="table"):
        validate_identifier(name, "table")


def test_qualified() -> None:
    assert qualified("cat", "db", "t") == "`cat`.`db`.`t`"
