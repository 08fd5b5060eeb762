"""The registry of consumer types: names in job specs to consumer classes.

A job spec names its consumer (``iteration.consumer.type``) as a built-in
(``replica``), an import path (``my_package.consumers:AuditConsumer``) or an
entry point in the ``lakeprop.consumers`` group of an installed distribution.
All three resolve the same way, to a :class:`~lakeprop.consumers.base.Consumer`
subclass that validates its options, lists the source columns they need and
does the work; the built-ins are simply import paths known in advance. The
registry sits beside the spec, below the consumers: it finds them by name, so
parsing a spec never imports the consumer implementations' layer statically.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any

from lakeprop.errors import InvalidConfigError, UnknownConsumerError

CONSUMER_BASE = "lakeprop.consumers.base.Consumer"
ENTRY_POINT_GROUP = "lakeprop.consumers"

BUILT_INS = {
    "replica": "lakeprop.consumers.replica:ReplicaConsumer",
    "secondary_index": "lakeprop.consumers.secondary_index:SecondaryIndexConsumer",
    "fulltext_index": "lakeprop.consumers.fulltext_index:FulltextIndexConsumer",
    "aggregate_view": "lakeprop.consumers.aggregate_view:AggregateViewConsumer",
    "kafka_changefeed": "lakeprop.consumers.kafka_changefeed:KafkaChangefeedConsumer",
    "join_view": "lakeprop.consumers.join_view.consumer:JoinViewConsumer",
    "auto_cdc": "lakeprop.consumers.auto_cdc.consumer:AutoCdcConsumer",
    "vector_index": "lakeprop.consumers.vector_index.consumer:VectorIndexConsumer",
}

_IMPORT_PATH = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
)


@dataclass(frozen=True)
class ConsumerType:
    """A named kind of consumer and the pure checks of its options."""

    name: str
    validate_options: Callable[[Mapping[str, Any]], dict[str, Any]]
    """Return normalised options or raise InvalidConsumerOptionsError."""
    source_columns: Callable[[Mapping[str, Any]], list[str]]
    """Source columns the (validated) options need; [] means no constraint."""
    factory: Callable[..., Any]
    """Builds the consumer of one job for one iteration from its ConsumerContext."""
    key_columns: Callable[[Mapping[str, Any]], list[str]] = field(default=lambda options: [])
    """Source columns the consumer matches its target on, by equality and under
    the same names; the engine bounds them by the change set (see
    :meth:`~lakeprop.consumers.base.ConsumerContext.in_change_range`)."""
    native: bool = False
    """Whether the consumer can apply a small change set without Spark (delta-rs)."""
    native_snapshot: bool = False
    """Whether the consumer can replace its target with a small table's rows without
    Spark (delta-rs)."""
    table_target: bool = True
    """Whether the consumer keeps a Delta table at its target name
    (:func:`~lakeprop.spec.target_table`) that other jobs may read as their
    source: the edges of the pipeline graph (:mod:`lakeprop.pipeline`)."""
    check_source: Callable[[Mapping[str, Any], Any, Any], None] = field(
        default=lambda options, schema, spark: None
    )
    """Checks the (validated) options against the source's schema (a Spark
    ``StructType``) with a session for Spark's parser and analyzer, at
    registration; raises InvalidConsumerOptionsError. Default: nothing more."""
    joined_sources: Callable[[Mapping[str, Any]], list[JoinedSource]] = field(
        default=lambda options: []
    )
    """The tables the (validated) options read beside the job's own source (a join):
    each is checked at registration, and a commit on any of them makes the job due
    (:meth:`~lakeprop.consumers.base.Consumer.joined_sources`). Default: none."""
    own_source: Callable[[Mapping[str, Any]], tuple[str, str] | None] = field(
        default=lambda options: None
    )
    """The (database, table) the options say the job must be registered on (a join's
    first table), checked at registration; None: any."""


@dataclass(frozen=True)
class JoinedSource:
    """A table a job reads beside its own source, and the columns it needs there."""

    database: str
    table: str
    columns: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"


_REGISTRY: dict[str, ConsumerType] = {}


def register_consumer_type(consumer_type: ConsumerType) -> None:
    """Make a consumer type available to job specs under its name."""
    if consumer_type.name in _REGISTRY or consumer_type.name in BUILT_INS:
        raise InvalidConfigError(f"consumer type {consumer_type.name!r} is already registered")
    _REGISTRY[consumer_type.name] = consumer_type


def get_consumer_type(name: object) -> ConsumerType:
    """The consumer type called ``name``, or a clear error.

    What an import path or entry point names is a Consumer subclass or a
    :class:`ConsumerType`; it is registered under ``name`` on first use. Anyone
    who can write to the change log can name any installed module this way:
    guard the topic's write access accordingly.
    """
    if not isinstance(name, str):
        raise UnknownConsumerError(f"consumer type must be a string, got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    target = _load(BUILT_INS.get(name, name))
    if target is None:
        raise UnknownConsumerError(
            f"unknown consumer type {name!r}; registered types: {consumer_type_names()}; "
            f"a custom consumer is named 'package.module:Class' or by an entry point in "
            f"the {ENTRY_POINT_GROUP!r} group"
        )
    consumer_type = _as_consumer_type(name, target)
    _REGISTRY[name] = consumer_type
    return consumer_type


def consumer_type_names() -> list[str]:
    return sorted({*BUILT_INS, *_REGISTRY})


def _load(name: str) -> object | None:
    if ":" in name:
        if not _IMPORT_PATH.fullmatch(name):
            raise UnknownConsumerError(
                f"consumer type {name!r} is not an import path of the form 'package.module:Class'"
            )
        module_name, _, attribute = name.partition(":")
        try:
            target: object = getattr(importlib.import_module(module_name), attribute)
            return target
        except (ImportError, AttributeError) as exc:
            raise UnknownConsumerError(f"cannot load consumer {name!r}: {exc}") from None
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        return None
    try:
        loaded: object = found[0].load()
        return loaded
    except Exception as exc:  # a broken plugin must not take the service down
        raise UnknownConsumerError(
            f"cannot load consumer entry point {name!r} ({found[0].value}): {exc}"
        ) from None


def _is_consumer_class(target: object) -> bool:
    return isinstance(target, type) and any(
        f"{c.__module__}.{c.__qualname__}" == CONSUMER_BASE for c in target.__mro__
    )


def _as_consumer_type(name: str, target: object) -> ConsumerType:
    if isinstance(target, ConsumerType):
        return replace(target, name=name)
    if _is_consumer_class(target):
        consumer: Any = target
        return ConsumerType(
            name=name,
            validate_options=consumer.validate_options,
            source_columns=consumer.source_columns,
            factory=consumer,
            key_columns=consumer.key_columns,
            check_source=consumer.check_source,
            joined_sources=consumer.joined_sources,
            own_source=consumer.own_source,
            native=bool(consumer.native),
            native_snapshot=bool(getattr(consumer, "native_snapshot", False)),
            table_target=bool(getattr(consumer, "table_target", True)),
        )
    raise UnknownConsumerError(
        f"consumer {name!r} names {target!r}, which is neither a Consumer subclass "
        "nor a ConsumerType"
    )
