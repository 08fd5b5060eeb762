"""Commit notifications: "table T reached version v", on a topic of their own.

A writing application announces its commits (``LakepropClient.notify_commit``),
and the service probes only the announced tables, plus each table once per
sweep interval (:mod:`lakeprop.engine.dirty`). A notice is a hint, never a
command: a lost or duplicated one costs at most a sweep interval of latency or
one extra probe, so the topic is read from its end when the service starts
(the first tick probes every table anyway) and no offsets are kept. Message::

    key:   "<database>.<table>"
    value: {"version": 1, "database": "sales", "table": "orders", "table_version": 42}

A notice that does not decode is logged and skipped. This module is the
notice's format, shared by the writers and the service; the service's reader is
:class:`lakeprop.service.notices.NoticeListener`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from lakeprop.config import KafkaConfig
from lakeprop.errors import InvalidMessageError
from lakeprop.identifiers import validate_identifier
from lakeprop.kafka import create_topic

log = logging.getLogger(__name__)

NOTICE_VERSION = 1
RETENTION_MS = 24 * 3600 * 1000
"""Notices are worth nothing after a sweep interval: a day of them is plenty."""


@dataclass(frozen=True)
class CommitNotice:
    """A writer's word that ``database.table`` reached ``version``."""

    database: str
    table: str
    version: int

    def encode(self) -> tuple[bytes, bytes]:
        value = {
            "version": NOTICE_VERSION,
            "database": self.database,
            "table": self.table,
            "table_version": self.version,
        }
        return f"{self.database}.{self.table}".encode(), json.dumps(value).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> CommitNotice:
        try:
            obj = json.loads(value or b"")
        except ValueError as exc:
            raise InvalidMessageError(f"commit notice is not JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.get("version") != NOTICE_VERSION:
            raise InvalidMessageError(
                f"commit notice must be a JSON object with version {NOTICE_VERSION}"
            )
        version = obj.get("table_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InvalidMessageError(
                f"commit notice table_version must be a Delta version (>= 0), got {version!r}"
            )
        for name in ("database", "table"):
            if not isinstance(obj.get(name), str):
                raise InvalidMessageError(f"commit notice {name} must be a string")
            validate_identifier(obj[name], name)
        return cls(obj["database"], obj["table"], version)


def ensure_notice_topic(kafka: KafkaConfig, topic: str, timeout: float = 30.0) -> None:
    create_topic(kafka, topic, kafka.topic_partitions, {"retention.ms": str(RETENTION_MS)}, timeout)
