"""The registry of consumer types.

A consumer type is registered under a name that job specs refer to
(``iteration.consumer.type``). It validates the consumer's options and lists the
source columns they rely on (so a bad spec is rejected before it reaches the
catalog), and builds the consumer that an iteration hands the changes to. The
contract a consumer keeps is in :mod:`lakeprop.consumers.base`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakeprop.errors import ErrorCode, InvalidSpecError

if TYPE_CHECKING:
    from lakeprop.consumers.base import Consumer, ConsumerContext


class InvalidConsumerOptionsError(InvalidSpecError):
    """The options of a consumer do not validate."""

    default_code = ErrorCode.INVALID_CONSUMER_OPTIONS


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


def get_consumer_type(name: object) -> ConsumerType:
    """The registered consumer type called ``name``, or a clear error."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownConsumerError(
            f"unknown consumer type {name!r}; registered types: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[name]


def consumer_type_names() -> list[str]:
    return sorted(_REGISTRY)


def _register_builtins() -> None:
    from lakeprop.consumers import replica

    register_consumer_type(replica.CONSUMER_TYPE)


_register_builtins()
