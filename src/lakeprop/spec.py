"""Job identity and job spec: what a job is and how it wants to be run.

A job is named by its :class:`JobKey` (tenant account, database, table, job
name: ISCP's JobID plus the tenant). Its :class:`JobSpec` is a
:class:`TriggerSpec` (when the runner starts an iteration) plus an
:class:`IterationDetail` (priority and the consumer that receives the changes).
Everything here is pure Python, validated on construction from plain JSON
values, and serialised canonically so that catalog rows compare byte for byte.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lakeprop import expectations
from lakeprop.errors import InvalidSpecError
from lakeprop.identifiers import validate_identifier
from lakeprop.registry import get_consumer_type

MAX_ACCOUNT_ID = 2**32 - 1
MAX_PRIORITY = 1_000_000
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def canonical_json(value: Any) -> str:
    """The one JSON text form of the project's stored values: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def parse_duration(value: object, what: str) -> float:
    """Seconds from ``10``, ``"10s"``, ``"500ms"``, ``"5m"``, ``"1h"`` or ``"1d"``."""
    if isinstance(value, bool):
        raise InvalidSpecError(f"{what} must be a duration like '10s', got a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise InvalidSpecError(f"{what} must be a duration like '10s', '5m' or '1h', got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidSpecError(f"{what} must be positive, got {value!r}")
    return seconds


def _expect_mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidSpecError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _reject_unknown(obj: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise InvalidSpecError(f"{what} has unknown field(s) {unknown}; allowed: {sorted(allowed)}")


@dataclass(frozen=True, order=True)
class JobKey:
    """Identity of a job: tenant, source table and job name."""

    account_id: int
    database: str
    table: str
    job_name: str

    def __post_init__(self) -> None:
        if isinstance(self.account_id, bool) or not isinstance(self.account_id, int):
            raise InvalidSpecError(
                f"job.account_id must be an integer, got {type(self.account_id).__name__}"
            )
        if not 0 <= self.account_id <= MAX_ACCOUNT_ID:
            raise InvalidSpecError(f"job.account_id must be in 0..{MAX_ACCOUNT_ID}")
        validate_identifier(self.database, "job.database")
        validate_identifier(self.table, "job.table")
        validate_identifier(self.job_name, "job.name")

    @classmethod
    def from_json(cls, value: object) -> JobKey:
        obj = _expect_mapping(value, "job")
        _reject_unknown(obj, {"account_id", "database", "table", "name"}, "job")
        missing = [f for f in ("account_id", "database", "table", "name") if f not in obj]
        if missing:
            raise InvalidSpecError(f"job is missing field(s) {missing}")
        return cls(obj["account_id"], obj["database"], obj["table"], obj["name"])

    def to_json(self) -> dict[str, Any]:
        return {
            "account_id": self.account_id,
            "database": self.database,
            "table": self.table,
            "name": self.job_name,
        }

    @property
    def message_key(self) -> bytes:
        """Kafka message key: all messages of one job land on one partition, in order."""
        return f"{self.account_id}/{self.database}/{self.table}/{self.job_name}".encode()

    def __str__(self) -> str:
        return f"{self.account_id}/{self.database}.{self.table}/{self.job_name}"


JobRef = tuple[JobKey, int]
"""A job's identity: its key and job id (a key registered again gets a new id)."""


class TriggerKind(str, Enum):
    DEFAULT = "default"
    GREEDY = "greedy"
    PERIODIC = "periodic"


@dataclass(frozen=True)
class TriggerSpec:
    """When the runner starts an iteration (ISCP's kinds: default, greedy, periodic)."""

    kind: TriggerKind = TriggerKind.DEFAULT
    interval_s: float | None = None
    share: bool = False

    def __post_init__(self) -> None:
        if self.kind is TriggerKind.PERIODIC:
            if self.interval_s is None:
                raise InvalidSpecError("trigger.interval is required for a periodic trigger")
        elif self.interval_s is not None or self.share:
            raise InvalidSpecError(
                f"trigger.interval and trigger.share apply only to periodic triggers, "
                f"not to {self.kind.value!r}"
            )

    @classmethod
    def from_json(cls, value: object) -> TriggerSpec:
        obj = _expect_mapping(value, "trigger")
        _reject_unknown(obj, {"kind", "interval", "share"}, "trigger")
        raw_kind = obj.get("kind", TriggerKind.DEFAULT.value)
        try:
            kind = TriggerKind(raw_kind)
        except ValueError:
            raise InvalidSpecError(
                f"trigger.kind must be one of {[k.value for k in TriggerKind]}, got {raw_kind!r}"
            ) from None
        interval = obj.get("interval")
        share = obj.get("share", False)
        if isinstance(share, str) and share.lower() in ("true", "false"):
            share = share.lower() == "true"  # ISCP writes "share": "true"
        if not isinstance(share, bool):
            raise InvalidSpecError(f"trigger.share must be true or false, got {share!r}")
        return cls(
            kind=kind,
            interval_s=None if interval is None else parse_duration(interval, "trigger.interval"),
            share=share,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value}
        if self.kind is TriggerKind.PERIODIC:
            out["interval"] = self.interval_s
            out["share"] = self.share
        return out


@dataclass(frozen=True)
class ConsumerInfo:
    """Which consumer receives the changes, and its options (validated by its type;
    the ``expectations`` option, any type's, by :mod:`lakeprop.expectations`).

    ``generation`` counts the job's resyncs: a resync bumps it, which makes the
    consumer a new one, so no earlier progress counts for it (as after a change
    of options) and it starts from a snapshot. Shown only once above 0.
    """

    type: str
    options: Mapping[str, Any] = field(default_factory=dict)
    generation: int = 0

    @classmethod
    def from_json(cls, value: object) -> ConsumerInfo:
        obj = _expect_mapping(value, "iteration.consumer")
        _reject_unknown(obj, {"type", "options", "generation"}, "iteration.consumer")
        if "type" not in obj:
            raise InvalidSpecError("iteration.consumer.type is required")
        consumer_type = get_consumer_type(obj["type"])
        options = _expect_mapping(obj.get("options") or {}, "iteration.consumer.options")
        generation = obj.get("generation") or 0
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise InvalidSpecError(
                f"iteration.consumer.generation must be 0 or more, got {generation!r}"
            )
        own, rules = expectations.split(options)
        return cls(
            type=consumer_type.name,
            options=expectations.joined(consumer_type.validate_options(own), rules),
            generation=generation,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "options": dict(self.options)}
        if self.generation:
            out["generation"] = self.generation
        return out

    def canonical(self) -> str:
        return canonical_json(self.to_json())


@dataclass(frozen=True)
class IterationDetail:
    """How the scheduler runs an iteration: priority (higher first) and consumer."""

    consumer: ConsumerInfo
    priority: int = 0

    @classmethod
    def from_json(cls, value: object) -> IterationDetail:
        obj = _expect_mapping(value, "iteration")
        _reject_unknown(obj, {"priority", "consumer"}, "iteration")
        priority = obj.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidSpecError(f"iteration.priority must be an integer, got {priority!r}")
        if abs(priority) > MAX_PRIORITY:
            raise InvalidSpecError(f"iteration.priority must be within ±{MAX_PRIORITY}")
        if "consumer" not in obj:
            raise InvalidSpecError("iteration.consumer is required")
        return cls(consumer=ConsumerInfo.from_json(obj["consumer"]), priority=priority)

    def to_json(self) -> dict[str, Any]:
        return {"priority": self.priority, "consumer": self.consumer.to_json()}


@dataclass(frozen=True)
class JobSpec:
    """TriggerSpec + IterationDetail, as in ISCP's JobSpec."""

    trigger: TriggerSpec
    iteration: IterationDetail

    @classmethod
    def from_json(cls, value: object) -> JobSpec:
        obj = _expect_mapping(value, "spec")
        _reject_unknown(obj, {"trigger", "iteration"}, "spec")
        if "iteration" not in obj:
            raise InvalidSpecError("spec.iteration is required")
        return cls(
            trigger=TriggerSpec.from_json(obj.get("trigger") or {}),
            iteration=IterationDetail.from_json(obj["iteration"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {"trigger": self.trigger.to_json(), "iteration": self.iteration.to_json()}

    def canonical(self) -> str:
        """Stable JSON text, as stored in the catalog."""
        return canonical_json(self.to_json())


def merge_spec(current: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Fill the empty fields of ``update`` from ``current`` (ISCP's UpdateJobSpec).

    Both are JSON-shaped specs. A field that is absent or null in the update keeps
    its current value. A trigger of a different kind, or a consumer of a different
    type, replaces the old one whole: fields of another kind do not carry over.
    The result still has to be validated with :meth:`JobSpec.from_json`.
    """
    merged: dict[str, Any] = {}
    cur_trigger = dict(current.get("trigger") or {})
    new_trigger = {k: v for k, v in dict(update.get("trigger") or {}).items() if v is not None}
    if new_trigger.get("kind", cur_trigger.get("kind")) != cur_trigger.get("kind"):
        merged["trigger"] = new_trigger
    else:
        merged["trigger"] = {**cur_trigger, **new_trigger}

    cur_iter = dict(current.get("iteration") or {})
    new_iter = {k: v for k, v in dict(update.get("iteration") or {}).items() if v is not None}
    iteration = {**cur_iter, **{k: v for k, v in new_iter.items() if k != "consumer"}}
    cur_consumer = dict(cur_iter.get("consumer") or {})
    new_consumer = {k: v for k, v in dict(new_iter.get("consumer") or {}).items() if v is not None}
    if new_consumer.get("type", cur_consumer.get("type")) != cur_consumer.get("type"):
        iteration["consumer"] = new_consumer
    else:
        options = {**dict(cur_consumer.get("options") or {})}
        options.update(
            {k: v for k, v in dict(new_consumer.get("options") or {}).items() if v is not None}
        )
        iteration["consumer"] = {**cur_consumer, **new_consumer, "options": options}
    merged["iteration"] = iteration
    return merged


def target_table(key: JobKey, options: Mapping[str, Any]) -> tuple[str, str]:
    """(database, table) of a consumer's target: the options' target_database and
    target_table, or <source database>.<source table>_<job name>."""
    return (
        options.get("target_database") or key.database,
        options.get("target_table") or f"{key.table}_{key.job_name}",
    )
