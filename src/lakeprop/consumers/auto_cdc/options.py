"""``auto_cdc`` options: AUTO CDC's names and meanings, validated without Spark.

What needs the source's schema (the columns exist, the expressions parse and
are deterministic) is checked at registration by :mod:`.expressions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakeprop.consumers.options import (
    TARGET_OPTIONS,
    identifier_list,
    reject_unknown_options,
    target_options,
)
from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError, LakepropError
from lakeprop.spec import parse_duration

NAME = "auto_cdc"
EVENTS, TABLE = "events", "table"
COMMIT_VERSION, COMMIT_TIMESTAMP = "_commit_version", "_commit_timestamp"
DEFAULT_TOMBSTONE_RETENTION = 7 * 86400.0

SEQUENCE = "__SEQUENCE"
"""SCD type 1: the sequence of the event a target row came from."""
COLUMN_SEQUENCES = "__COLUMN_SEQUENCES"
"""SCD type 1 with ``ignore_null_updates``: per column, the sequence its value came from."""
START_AT, END_AT = "__START_AT", "__END_AT"
"""SCD type 2: a version's interval ``[__START_AT, __END_AT)``; open while ``__END_AT`` is NULL."""
RESERVED = frozenset({SEQUENCE, COLUMN_SEQUENCES, START_AT, END_AT})

ALLOWED = {
    "keys",
    "sequence_by",
    "source_kind",
    "apply_as_deletes",
    "apply_as_truncates",
    "column_list",
    "except_column_list",
    "stored_as_scd_type",
    "track_history_column_list",
    "track_history_except_column_list",
    "ignore_null_updates",
    "tombstone_retention",
    "quarantine",
    "skip_change_commits",
    *TARGET_OPTIONS,
}


@dataclass(frozen=True)
class CdcOptions:
    """The options of one ``auto_cdc`` job, normalised."""

    keys: tuple[str, ...]
    sequence_by: tuple[str, ...]
    """Columns ordered first by the first (struct ordering); for a table source,
    ``_commit_version`` (the default) or ``_commit_timestamp``."""
    source_kind: str
    scd_type: int
    apply_as_deletes: str | None = None
    apply_as_truncates: str | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] = ()
    track_history_column_list: tuple[str, ...] | None = None
    track_history_except_column_list: tuple[str, ...] = ()
    ignore_null_updates: bool = False
    tombstone_retention: float = DEFAULT_TOMBSTONE_RETENTION
    quarantine: bool = False
    skip_change_commits: bool = False
    """Event source: commits that update or delete event rows (retention deletes) are
    skipped whole, as Databricks' ``skipChangeCommits`` does, instead of an error."""

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> CdcOptions:
        return cls(
            keys=tuple(options["keys"]),
            sequence_by=tuple(options["sequence_by"]),
            source_kind=options["source_kind"],
            scd_type=int(options["stored_as_scd_type"]),
            apply_as_deletes=options.get("apply_as_deletes"),
            apply_as_truncates=options.get("apply_as_truncates"),
            column_list=None
            if options.get("column_list") is None
            else tuple(options["column_list"]),
            except_column_list=tuple(options.get("except_column_list") or ()),
            track_history_column_list=(
                None
                if options.get("track_history_column_list") is None
                else tuple(options["track_history_column_list"])
            ),
            track_history_except_column_list=tuple(
                options.get("track_history_except_column_list") or ()
            ),
            ignore_null_updates=bool(options.get("ignore_null_updates", False)),
            tombstone_retention=float(options["tombstone_retention"]),
            quarantine=bool(options.get("quarantine", False)),
            skip_change_commits=bool(options.get("skip_change_commits", False)),
        )

    @property
    def table_source(self) -> bool:
        return self.source_kind == TABLE

    def target_columns(self, source: Sequence[str]) -> list[str]:
        """The non-key columns of the target, in the source's order, for the source's
        columns now (a column added to the source is taken when the lists admit it)."""
        keys = {k.lower() for k in self.keys}
        excluded = {c.lower() for c in self.except_column_list}
        chosen = None if self.column_list is None else {c.lower() for c in self.column_list}
        return [
            c
            for c in source
            if c.lower() not in keys
            and c.lower() not in excluded
            and (chosen is None or c.lower() in chosen)
            and not c.startswith("_commit_")
            and c != "_change_type"
        ]

    def tracked(self, columns: Sequence[str]) -> list[str]:
        """SCD type 2: the target columns whose change opens a new version."""
        if self.track_history_column_list is not None:
            chosen = {c.lower() for c in self.track_history_column_list}
            return [c for c in columns if c.lower() in chosen]
        excluded = {c.lower() for c in self.track_history_except_column_list}
        return [c for c in columns if c.lower() not in excluded]


def _optional_list(options: Mapping[str, Any], name: str) -> list[str] | None:
    if options.get(name) is None:
        return None
    return identifier_list(options[name], NAME, name)


def _expression(options: Mapping[str, Any], name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidConsumerOptionsError(f"{NAME} option {name} must be a SQL boolean expression")
    if len(value) > 4000:
        raise InvalidConsumerOptionsError(f"{NAME} option {name} is longer than 4000 characters")
    return value.strip()


def validate(options: Mapping[str, Any]) -> dict[str, Any]:
    """Normalised options, or InvalidConsumerOptionsError saying which rule broke."""
    reject_unknown_options(NAME, options, ALLOWED)
    kind = options.get("source_kind", EVENTS)
    if kind not in (EVENTS, TABLE):
        raise InvalidConsumerOptionsError(
            f"{NAME} option source_kind must be {EVENTS!r} or {TABLE!r}, got {kind!r}"
        )
    try:
        out = _names(options, kind)
    except InvalidIdentifierError as exc:
        raise InvalidConsumerOptionsError(str(exc)) from None
    out["stored_as_scd_type"] = _scd_type(options.get("stored_as_scd_type", 1))
    out["apply_as_deletes"] = _expression(options, "apply_as_deletes")
    out["apply_as_truncates"] = _expression(options, "apply_as_truncates")
    for flag in ("ignore_null_updates", "quarantine", "skip_change_commits"):
        value = options.get(flag, False)
        if not isinstance(value, bool):
            raise InvalidConsumerOptionsError(f"{NAME} option {flag} must be true or false")
        out[flag] = value
    _combinations(out)
    try:
        out["tombstone_retention"] = parse_duration(
            options.get("tombstone_retention", DEFAULT_TOMBSTONE_RETENTION),
            f"{NAME} option tombstone_retention",
        )
    except LakepropError as exc:
        raise InvalidConsumerOptionsError(str(exc)) from None
    return out


def _names(options: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The column names the options give: keys, sequence, column and history lists."""
    keys = identifier_list(options.get("keys"), NAME, "keys")
    raw = options.get("sequence_by")
    if isinstance(raw, str):
        raw = [raw]
    if kind == TABLE:
        sequence = list(raw or [COMMIT_VERSION])
        if sequence == [COMMIT_TIMESTAMP]:
            # equal commit timestamps (two commits in one millisecond) are told apart by
            # the commit version: one sequence type in the snapshot and in the tails
            sequence = [COMMIT_TIMESTAMP, COMMIT_VERSION]
        if sequence not in ([COMMIT_VERSION], [COMMIT_TIMESTAMP, COMMIT_VERSION]):
            raise InvalidConsumerOptionsError(
                f"{NAME} option sequence_by of a table source is {COMMIT_VERSION!r} (the "
                f"default) or {COMMIT_TIMESTAMP!r}, got {raw!r}"
            )
    elif raw is None:
        raise InvalidConsumerOptionsError(
            f"{NAME} option sequence_by is required for an event source: the column(s) "
            "that order the events"
        )
    else:
        sequence = identifier_list(raw, NAME, "sequence_by")
    return {
        "keys": keys,
        "sequence_by": sequence,
        "source_kind": kind,
        **{
            name: _optional_list(options, name)
            for name in (
                "column_list",
                "except_column_list",
                "track_history_column_list",
                "track_history_except_column_list",
            )
        },
        **target_options(options),
    }


def _scd_type(value: Any) -> int:
    if isinstance(value, str) and value.strip() in ("1", "2"):
        value = int(value)
    if value not in (1, 2) or isinstance(value, bool):
        raise InvalidConsumerOptionsError(
            f"{NAME} option stored_as_scd_type must be 1 or 2, got {value!r}"
        )
    return int(value)


def _source_rules(out: Mapping[str, Any]) -> None:
    """What a table source's change feed decides for itself."""
    if out["source_kind"] != TABLE:
        return
    if out["skip_change_commits"]:
        raise InvalidConsumerOptionsError(
            f"{NAME} option skip_change_commits is for event sources: a table source's "
            "updates and deletes are its changes"
        )
    if out["apply_as_deletes"] or out["apply_as_truncates"]:
        raise InvalidConsumerOptionsError(
            f"{NAME}: a table source's deletes come from its change feed; apply_as_deletes and "
            "apply_as_truncates are for event sources"
        )


def _combinations(out: Mapping[str, Any]) -> None:
    """Option combinations that make no sense."""
    _source_rules(out)
    scd = out["stored_as_scd_type"]
    if out["apply_as_truncates"] is not None and scd == 2:
        raise InvalidConsumerOptionsError(
            f"{NAME} option apply_as_truncates is for SCD type 1 only: a truncate has no place "
            "in a history"
        )
    exclusive = (
        ("column_list", "except_column_list"),
        ("track_history_column_list", "track_history_except_column_list"),
    )
    for first, second in exclusive:
        if out[first] is not None and out[second] is not None:
            raise InvalidConsumerOptionsError(
                f"{NAME} options {first} and {second} are mutually exclusive"
            )
    if scd != 2 and (
        out["track_history_column_list"] is not None
        or out["track_history_except_column_list"] is not None
    ):
        raise InvalidConsumerOptionsError(
            f"{NAME} options track_history_column_list and track_history_except_column_list "
            "are for SCD type 2 only"
        )
    keys = {k.lower() for k in out["keys"]}
    overlap = [c for c in out["sequence_by"] if c.lower() in keys]
    if overlap:
        raise InvalidConsumerOptionsError(f"{NAME}: sequence_by column(s) {overlap} are keys")
    for name in ("column_list", "except_column_list"):
        named = [c for c in (out[name] or []) if c.lower() in keys]
        if named:
            raise InvalidConsumerOptionsError(
                f"{NAME} option {name} names key column(s) {named}: keys always go to the target"
            )
    reserved = [c for c in (*out["keys"], *(out["column_list"] or [])) if c in RESERVED]
    if reserved:
        raise InvalidConsumerOptionsError(f"{NAME}: column name(s) {reserved} are reserved")


def source_columns(options: Mapping[str, Any]) -> list[str]:
    """Source columns the options name (checked at registration)."""
    named = [*options["keys"]]
    if options["source_kind"] == EVENTS:
        named += options["sequence_by"]
    for name in ("column_list", "except_column_list", "track_history_column_list"):
        named += options.get(name) or []
    named += options.get("track_history_except_column_list") or []
    out: list[str] = []
    for column in named:
        if column.lower() not in {c.lower() for c in out}:
            out.append(column)
    return out
