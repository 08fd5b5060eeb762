"""Expectations: named rules on the rows a job takes in, and what breaking one does.

A job's consumer options may carry ``expectations``, a list of rules::

    "expectations": [
      {"name": "amount_known", "check": "amount IS NOT NULL", "action": "drop"},
      {"name": "one_row_per_id", "unique": ["id"], "action": "fail"}
    ]

A ``check`` is a deterministic SQL boolean over the source's columns (checked
against the source at registration); a row keeps it when it is true, so NULL
breaks it. ``unique`` names columns no two source rows may share, checked on
the keys an iteration changed only. The actions:

``warn``
    the row goes through; it is counted.
``drop``
    the row does not go through: it goes to ``<target>__quarantine`` with the
    rules it broke and its source version. The target holds exactly the
    source rows that keep every ``drop`` rule.
``fail``
    the iteration fails permanently, naming the rule and a few keys; nothing
    of its range is written.

This module is the pure part: the rules, parsed and validated from JSON. The
engine evaluates them (:mod:`lakeprop.engine.expect`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError
from lakeprop.identifiers import validate_identifier

OPTION = "expectations"
"""The consumer option that holds a job's rules (any consumer type)."""
WARN, DROP, FAIL = "warn", "drop", "fail"
ACTIONS = (WARN, DROP, FAIL)
MAX_RULES = 50
MAX_CHECK_LENGTH = 4000
_FIELDS = {"name", "check", "unique", "action"}


@dataclass(frozen=True)
class Expectation:
    """One named rule: a ``check`` expression or a ``unique`` column list, and its action."""

    name: str
    action: str
    check: str | None = None
    unique: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, value: object, at: int) -> Expectation:
        where = f"option {OPTION}[{at}]"
        if not isinstance(value, Mapping):
            raise InvalidConsumerOptionsError(f"{where} must be a JSON object")
        unknown = sorted(set(value) - _FIELDS)
        if unknown:
            raise InvalidConsumerOptionsError(
                f"{where} has unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}"
            )
        try:
            name = validate_identifier(value.get("name"), f"{where}.name")
        except InvalidIdentifierError as exc:
            raise InvalidConsumerOptionsError(str(exc)) from None
        where = f"expectation {name}"
        action = value.get("action", WARN)
        if action not in ACTIONS:
            raise InvalidConsumerOptionsError(
                f"{where}: action must be one of {list(ACTIONS)}, got {action!r}"
            )
        check, unique = value.get("check"), value.get("unique")
        if (check is None) == (unique is None):
            raise InvalidConsumerOptionsError(
                f"{where} must have exactly one of check (a SQL boolean) or unique (columns)"
            )
        if check is not None:
            if not isinstance(check, str) or not check.strip():
                raise InvalidConsumerOptionsError(f"{where}: check must be a non-empty SQL text")
            if len(check) > MAX_CHECK_LENGTH:
                raise InvalidConsumerOptionsError(
                    f"{where}: check is longer than {MAX_CHECK_LENGTH} characters"
                )
            return cls(name, action, check=check.strip())
        if action == DROP:
            raise InvalidConsumerOptionsError(
                f"{where}: a unique rule cannot drop (which of the rows sharing a key would "
                "go?); its action is warn or fail"
            )
        return cls(name, action, unique=tuple(_columns(unique, where)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "action": self.action}
        if self.check is not None:
            out["check"] = self.check
        else:
            out["unique"] = list(self.unique)
        return out

    @property
    def rule(self) -> str:
        """The rule as a person reads it."""
        return self.check if self.check is not None else f"unique({', '.join(self.unique)})"


def _columns(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidConsumerOptionsError(f"{where}: unique must be a non-empty list of columns")
    try:
        names = [validate_identifier(v, f"{where} unique column") for v in value]
    except InvalidIdentifierError as exc:
        raise InvalidConsumerOptionsError(str(exc)) from None
    if len({n.lower() for n in names}) != len(names):
        raise InvalidConsumerOptionsError(f"{where}: unique lists a column twice")
    return names


def parse(value: object) -> tuple[Expectation, ...]:
    """The rules of an ``expectations`` option, validated; names are distinct."""
    if not isinstance(value, list):
        raise InvalidConsumerOptionsError(f"option {OPTION} must be a list of rules")
    if len(value) > MAX_RULES:
        raise InvalidConsumerOptionsError(f"option {OPTION} holds more than {MAX_RULES} rules")
    rules = tuple(Expectation.from_json(v, i) for i, v in enumerate(value))
    seen: set[str] = set()
    for rule in rules:
        if rule.name.lower() in seen:
            raise InvalidConsumerOptionsError(f"option {OPTION} names {rule.name} twice")
        seen.add(rule.name.lower())
    return rules


def split(options: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Expectation, ...]]:
    """A consumer's own options, and its rules (validated): the consumer type
    validates the first, never sees the second."""
    rest = {k: v for k, v in options.items() if k != OPTION}
    raw = options.get(OPTION)
    return rest, (() if raw is None else parse(raw))


def joined(options: Mapping[str, Any], rules: Sequence[Expectation]) -> dict[str, Any]:
    """Validated options with their rules put back (none stored when there are none,
    so options without rules, and their write identity, stay as they were)."""
    if not rules:
        return dict(options)
    return {**options, OPTION: [r.to_json() for r in rules]}


def of(options: Mapping[str, Any]) -> tuple[Expectation, ...]:
    """The rules of validated options (none when there are none)."""
    return split(options)[1]


def columns(rules: Sequence[Expectation]) -> list[str]:
    """The source columns the ``unique`` rules name, each once (checked at registration)."""
    out: list[str] = []
    for rule in rules:
        out += [c for c in rule.unique if c.lower() not in {o.lower() for o in out}]
    return out


def keeping(rules: Sequence[Expectation]) -> str | None:
    """The SQL condition a source row meets when every ``drop`` rule keeps it (a
    rule that comes out NULL drops, as the rules' own pass reads it), or None
    when no rule drops: what a consumer applies to rows it reads from the source
    itself (an aggregate's extremes), so they are the rows its target holds."""
    drops = [r for r in rules if r.action == DROP and r.check is not None]
    if not drops:
        return None
    # each check on a line of its own: a check may end in a ``--`` comment
    return " AND ".join(f"coalesce(({r.check}\n), false)" for r in drops)
