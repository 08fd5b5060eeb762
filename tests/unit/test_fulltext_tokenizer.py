"""The full-text tokenizer and the fulltext_index options (no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

from lakeprop.consumers import InvalidConsumerOptionsError
from lakeprop.consumers.fulltext_index import FulltextIndexConsumer, Tokenizer

validate_options = FulltextIndexConsumer.validate_options

BASE = {"columns": ["title", "body"], "primary_key": ["id"]}


def test_default_tokenizer_lowercases_splits_and_drops_english_stop_words() -> None:
    tokens = Tokenizer().tokens("The Quick_brown fox, and the lazy DOG!")
    # positions count every token, stop words included
    assert tokens == [(1, "quick"), (2, "brown"), (3, "fox"), (6, "lazy"), (7, "dog")]


def test_unicode_words_stay_whole() -> None:
    assert Tokenizer().tokens("Café naïve—Straße 42") == [
        (0, "café"),
        (1, "naïve"),
        (2, "straße"),
        (3, "42"),
    ]


def test_configured_tokenizer() -> None:
    options = validate_options(
        {
            **BASE,
            "tokenizer": {
                "lowercase": False,
                "pattern": r"\s+",
                "stop_words": ["Skip"],
                "min_length": 2,
            },
        }
    )
    tokenizer = Tokenizer.from_options(options["tokenizer"])
    assert tokenizer.tokens("Skip a Big-deal  x YES") == [(2, "Big-deal"), (4, "YES")]


def test_query_terms_are_distinct_in_first_appearance_order() -> None:
    assert Tokenizer().terms("fox the Fox quick fox") == ["fox", "quick"]
    assert Tokenizer().terms("the and of") == []
    assert Tokenizer().tokens(None) == []


def test_options_are_normalised_with_defaults() -> None:
    assert validate_options(BASE) == {
        **BASE,
        "tokenizer": {
            "lowercase": True,
            "pattern": r"[\W_]+",
            "stop_words": "english",
            "min_length": 1,
        },
        "target_database": None,
        "target_table": None,
    }
    listed = validate_options({**BASE, "tokenizer": {"stop_words": ["b", "a", "b"]}})
    assert listed["tokenizer"]["stop_words"] == ["a", "b"]


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"primary_key": ["id"]}, "columns is required"),
        ({**BASE, "columns": ["ti'tle"]}, "columns entry"),
        ({**BASE, "primary_key": ["term"]}, "clash"),
        ({**BASE, "extra": 1}, "unknown option"),
        ({**BASE, "tokenizer": {"pattern": "(a|b)"}}, "must not capture"),
        ({**BASE, "tokenizer": {"pattern": "x*"}}, "matches the empty string"),
        ({**BASE, "tokenizer": {"pattern": "[unclosed"}}, "not a regular expression"),
        ({**BASE, "tokenizer": {"pattern": "a" * 201}}, "1 to 200 characters"),
        ({**BASE, "tokenizer": {"stop_words": "french"}}, "stop_words"),
        ({**BASE, "tokenizer": {"stop_words": [""]}}, "stop_words"),
        ({**BASE, "tokenizer": {"min_length": 0}}, "min_length"),
        ({**BASE, "tokenizer": {"min_length": True}}, "min_length"),
        ({**BASE, "tokenizer": {"lowercase": "yes"}}, "lowercase"),
        ({**BASE, "tokenizer": {"stem": True}}, "unknown option"),
        ({**BASE, "tokenizer": "english"}, "must be an object"),
    ],
)
def test_bad_options_are_rejected_with_a_reason(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidConsumerOptionsError, match=reason):
        validate_options(options)
