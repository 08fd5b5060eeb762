"""The registry of consumer types.

A consumer type is registered under a name that job specs refer to
(``iteration.consumer.type``). It validates the consumer's options and lists the
source columns they rely on (so a bad spec is rejected before it reaches the
catalog), and builds the consumer that an iteration hands the changes to. The
contract a consumer keeps is in :mod:`lakeprop.consumers.base`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from lakeprop.errors import ErrorCode, InvalidSpecError

if TYPE_CHECKING:
    from lakeprop.consumers.base import Consumer, ConsumerContext


class InvalidConsumerOptionsError(InvalidSpecError):
    """The options of a consumer do not validate."""

    default_code = ErrorCode.INVALID_CONSUMER_OPTIONS


def reject_unknown_options(consumer: str, options: Mapping[str, Any], allowed: set[str]) -> None:
    """Raise naming the options a consumer type does not know."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidConsumerOptionsError(
            f"{consumer} has unknown option(s) {unknown}; allowed: {sorted(allowed)}"
        )


class UnknownConsumerError(InvalidSpecError):
    """A job spec names a consumer type that is not registered."""

    default_code = ErrorCode.UNKNOWN_CONSUMER


@dataclass(frozen=True)
class ConsumerType:
    """A named kind of consumer and the pure checks of its options."""

    name: str
    validate_options: Callable[[Mapping[str, Any]], dict[str, Any]]
    """Return normalised options or raise :class:`InvalidConsumerOptionsError`."""
    source_columns: Callable[[Mapping[str, Any]], list[str]]
    """Source columns the (validated) options need; [] means no constraint."""
    factory: Callable[[ConsumerContext], Consumer]
    """Builds the consumer of one job for one iteration."""


_REGISTRY: dict[str, ConsumerType] = {}


def register_consumer_type(consumer_type: ConsumerType) -> None:
    """Make a consumer type available to job specs under its name."""
    if consumer_type.name in _REGISTRY:
        raise ValueError(f"consumer type {consumer_type.name!r} is already registered")
    _REGISTRY[consumer_type.name] = consumer_type


ENTRY_POINT_GROUP = "lakeprop.consumers"
_IMPORT_PATH = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
)


def get_consumer_type(name: object) -> ConsumerType:
    """The consumer type called ``name``, or a clear error.

    ``name`` is a registered type (``replica``), an import path
    (``my_package.consumers:AuditConsumer``), or the name of an entry point in
    the ``lakeprop.consumers`` group of an installed distribution. What an import
    path or entry point names is a :class:`~lakeprop.consumers.base.Consumer`
    subclass or a :class:`ConsumerType`; it is registered under ``name`` on first
    use. Anyone who can write to the change log can name any installed module
    this way: guard the topic's write access accordingly.
    """
    if not isinstance(name, str):
        raise UnknownConsumerError(f"consumer type must be a string, got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    target = _load(name)
    if target is None:
        raise UnknownConsumerError(
            f"unknown consumer type {name!r}; registered types: {sorted(_REGISTRY)}; "
            f"a custom consumer is named 'package.module:Class' or by an entry point in "
            f"the {ENTRY_POINT_GROUP!r} group"
        )
    consumer_type = _as_consumer_type(name, target)
    _REGISTRY[name] = consumer_type
    return consumer_type


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


def _as_consumer_type(name: str, target: object) -> ConsumerType:
    from lakeprop.consumers.base import Consumer

    if isinstance(target, ConsumerType):
        return replace(target, name=name)
    if isinstance(target, type) and issubclass(target, Consumer):
        return ConsumerType(
            name=name,
            validate_options=target.validate_options,
            source_columns=target.source_columns,
            factory=target,
        )
    raise UnknownConsumerError(
        f"consumer {name!r} names {target!r}, which is neither a Consumer subclass "
        "nor a ConsumerType"
    )


def consumer_type_names() -> list[str]:
    return sorted(_REGISTRY)


def _register_builtins() -> None:
    from lakeprop.consumers import (
        aggregate_view,
        fulltext_index,
        kafka_changefeed,
        replica,
        secondary_index,
    )

    for module in (replica, secondary_index, fulltext_index, aggregate_view, kafka_changefeed):
        register_consumer_type(module.CONSUMER_TYPE)


_register_builtins()
