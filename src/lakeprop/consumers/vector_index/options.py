"""The ``vector_index`` options, validated at registration, and the re-training policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lakeprop.consumers.options import (
    CHANGE_FEED,
    TARGET_OPTIONS,
    identifier_list,
    reject_unknown_options,
    target_options,
)
from lakeprop.consumers.vector_index.ivf import METRICS, Drift
from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError
from lakeprop.identifiers import validate_identifier

NAME = "vector_index"
INDEX_COLUMNS = ("index_version", "list_id", "vector_bytes")
"""Columns the postings table adds to the key, vector and included columns (the
last holds the vectors, :data:`.ivf.BYTES`)."""
_ALLOWED = {
    "key",
    "vector",
    "metric",
    "lists",
    "nprobe",
    "include",
    "dimension",
    "quarantine",
    "retrain",
    *(TARGET_OPTIONS - {CHANGE_FEED}),  # its tables are its own, read through search
}
MAX_LISTS = 65_536


@dataclass(frozen=True)
class RetrainPolicy:
    """When drift calls for a new index version (any threshold passed)."""

    enabled: bool = True
    max_imbalance: float = 5.0
    """Largest list / mean list size."""
    max_empty_share: float = 0.25
    """Share of empty lists."""
    max_changed_share: float = 0.5
    """Vectors changed since training / vectors trained on."""
    min_recall: float = 0.9
    """Sampled recall@10 at the default nprobe."""
    recall_check_every: int = 10
    """Iterations between two sampled recall checks (0: never)."""

    def reasons(self, measured: Drift) -> list[str]:
        """The thresholds ``measured`` passed (empty: keep the live version)."""
        if not self.enabled:
            return []
        reasons = []
        if measured.imbalance > self.max_imbalance:
            reasons.append(f"imbalance {measured.imbalance:.2f} > {self.max_imbalance}")
        if measured.empty_share > self.max_empty_share:
            reasons.append(f"empty lists {measured.empty_share:.2f} > {self.max_empty_share}")
        if measured.changed_share > self.max_changed_share:
            reasons.append(f"changed {measured.changed_share:.2f} > {self.max_changed_share}")
        if measured.recall is not None and measured.recall < self.min_recall:
            reasons.append(f"recall {measured.recall:.3f} < {self.min_recall}")
        return reasons

    def check_recall(self, iterations_since_training: int) -> bool:
        every = self.recall_check_every
        return self.enabled and every > 0 and iterations_since_training % every == 0


@dataclass(frozen=True)
class VectorOptions:
    key: tuple[str, ...]
    vector: str
    metric: str = "l2"
    lists: int | None = None
    nprobe: int | None = None
    include: tuple[str, ...] = ()
    dimension: int | None = None
    quarantine: bool = False
    retrain: RetrainPolicy = field(default_factory=RetrainPolicy)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> VectorOptions:
        """From options :func:`validate` returned."""
        return cls(
            key=tuple(options["key"]),
            vector=options["vector"],
            metric=options["metric"],
            lists=options.get("lists"),
            nprobe=options.get("nprobe"),
            include=tuple(options.get("include") or ()),
            dimension=options.get("dimension"),
            quarantine=bool(options.get("quarantine", False)),
            retrain=RetrainPolicy(**(options.get("retrain") or {})),
        )

    @property
    def columns(self) -> list[str]:
        """Source columns the postings keep: key, vector, included."""
        return [*self.key, self.vector, *self.include]


def _positive_int(value: object, what: str, upper: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConsumerOptionsError(f"{NAME} option {what} must be a positive integer")
    if upper is not None and value > upper:
        raise InvalidConsumerOptionsError(f"{NAME} option {what} must be at most {upper}")
    return value


def _retrain(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidConsumerOptionsError(f"{NAME} option retrain must be an object")
    known = set(RetrainPolicy.__dataclass_fields__)
    reject_unknown_options(f"{NAME} retrain", value, known)
    out: dict[str, Any] = {}
    for name, raw in value.items():
        default = getattr(RetrainPolicy(), name)
        if isinstance(default, bool):
            ok = isinstance(raw, bool)
        elif isinstance(default, int):
            ok = isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0
        else:
            ok = isinstance(raw, int | float) and not isinstance(raw, bool) and raw >= 0
        if not ok:
            raise InvalidConsumerOptionsError(
                f"{NAME} retrain.{name} must be {type(default).__name__} >= 0, got {raw!r}"
            )
        out[name] = raw
    return out


def validate(options: Mapping[str, Any]) -> dict[str, Any]:
    """Normalised options, or InvalidConsumerOptionsError naming the problem."""
    reject_unknown_options(NAME, options, _ALLOWED)
    try:
        key = identifier_list(options.get("key"), NAME, "key")
        if options.get("vector") is None:
            raise InvalidConsumerOptionsError(f"{NAME} option vector is required")
        vector = validate_identifier(options["vector"], f"{NAME} option vector")
        include = (
            identifier_list(options["include"], NAME, "include") if options.get("include") else []
        )
        targets = target_options(options)
    except InvalidIdentifierError as exc:
        raise InvalidConsumerOptionsError(f"{NAME}: {exc}") from None
    metric = options.get("metric", "l2")
    if metric not in METRICS:
        raise InvalidConsumerOptionsError(
            f"{NAME} option metric must be one of {list(METRICS)}, got {metric!r}"
        )
    lists = _positive_int(options.get("lists"), "lists", MAX_LISTS)
    nprobe = _positive_int(options.get("nprobe"), "nprobe", MAX_LISTS)
    if lists is not None and nprobe is not None and nprobe > lists:
        raise InvalidConsumerOptionsError(
            f"{NAME} option nprobe ({nprobe}) must not exceed lists ({lists})"
        )
    quarantine = options.get("quarantine", False)
    if not isinstance(quarantine, bool):
        raise InvalidConsumerOptionsError(f"{NAME} option quarantine must be true or false")
    lowered = [c.lower() for c in key]
    if vector.lower() in lowered:
        raise InvalidConsumerOptionsError(f"{NAME} option vector {vector!r} is a key column")
    shared = sorted({c.lower() for c in include} & {*lowered, vector.lower()})
    if shared:
        raise InvalidConsumerOptionsError(
            f"{NAME} option include repeats the key or vector column(s) {shared}"
        )
    reserved = sorted({c.lower() for c in [*key, vector, *include]} & set(INDEX_COLUMNS))
    if reserved:
        raise InvalidConsumerOptionsError(
            f"{NAME} column(s) {reserved} clash with the index's own columns {list(INDEX_COLUMNS)}"
        )
    return {
        "key": key,
        "vector": vector,
        "metric": metric,
        "lists": lists,
        "nprobe": nprobe,
        "include": include,
        "dimension": _positive_int(options.get("dimension"), "dimension", 65_536),
        "quarantine": quarantine,
        "retrain": _retrain(options.get("retrain")),
        **targets,
    }
