"""Consumers: what an iteration hands a table's changes to.

Every consumer, built-in or user-defined, is a :class:`Consumer` subclass (the
contract is in :mod:`lakeprop.consumers.base`). Job specs name them through the
registry (:mod:`lakeprop.registry`): built-ins by name, others by import path or
entry point. Shared chores live here too: option checks (:mod:`.options`) and
change-set helpers (:mod:`.changes`).
"""

from __future__ import annotations

from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.errors import InvalidConsumerOptionsError, UnknownConsumerError
from lakeprop.registry import (
    ConsumerType,
    consumer_type_names,
    get_consumer_type,
    register_consumer_type,
)

__all__ = [
    "Consumer",
    "ConsumerContext",
    "ConsumerType",
    "InvalidConsumerOptionsError",
    "UnknownConsumerError",
    "consumer_type_names",
    "get_consumer_type",
    "register_consumer_type",
]
