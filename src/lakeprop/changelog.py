"""The change log: the versioned JSON envelope of job registrations on Kafka.

Modelled on ``mo_iscp_log``: every register, unregister and spec update is a
message on one topic, keyed by the job key so that one job's messages stay in
order on one partition. Version 1 of the envelope of a job's message::

    {"version": 1,
     "op": "register" | "unregister" | "update_spec",
     "request_id": "c0ffee-...",
     "job": {"account_id": 0, "database": "sales", "table": "orders", "name": "copy"},
     "spec": {"trigger": {"kind": "periodic", "interval": "30s", "share": true},
              "iteration": {"priority": 5,
                            "consumer": {"type": "replica",
                                         "options": {"primary_key": ["id"]}}}},
     "interrupt": false}

``spec`` is required for ``register`` and is a partial spec for ``update_spec``
(empty fields are filled from the current spec); ``interrupt`` (update_spec
only) cancels the job's queued or running iteration so the new spec applies at
once. ``cascade`` (unregister only) drops the jobs downstream of the job too
(:mod:`lakeprop.pipeline`); without it, the unregister of a job whose target
other jobs read is rejected. ``pause``, ``resume`` and ``resync`` carry the job
only.

A bulk operation (:mod:`lakeprop.bulk`) names an account and a selector
instead of a job, and is keyed by its id (``bulk/<account>/<id>``), which is
its request id; its cancel and its rollback carry the same key::

    {"version": 1, "op": "bulk", "request_id": "b-2026-11-24-1", "account_id": 0,
     "selector": {"database": "sales", "job_name": "copy_*"},
     "operation": "update_spec", "spec": {...}, "interrupt": false}
    {"version": 1, "op": "bulk_cancel", "request_id": "...", "account_id": 0,
     "bulk_id": "b-2026-11-24-1"}

Decoding is pure: a :class:`LogRecord` in, a :class:`Command` out, or an
:class:`~lakeprop.errors.InvalidMessageError` whose message says what is wrong.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from typing import Any

from lakeprop.config import KafkaConfig
from lakeprop.errors import ErrorCode, InvalidMessageError, InvalidSpecError
from lakeprop.kafka import create_topic
from lakeprop.spec import JobKey, JobSpec

ENVELOPE_VERSION = 1
JOB_PARTITION = 0
"""The change-log partition every job message goes to. One partition is one order:
the pipeline graph (cycles, one writer per target, readers left behind) is decided
message by message, and in a cluster every instance must decide each message the
same way whatever its micro-batches held (decision 0012)."""
MAX_REQUEST_ID_LENGTH = 128


class Operation(str, Enum):
    REGISTER = "register"
    UNREGISTER = "unregister"
    UPDATE_SPEC = "update_spec"
    PAUSE = "pause"
    RESUME = "resume"
    RESYNC = "resync"
    BULK = "bulk"
    BULK_CANCEL = "bulk_cancel"
    BULK_ROLLBACK = "bulk_rollback"

    @property
    def bulk(self) -> bool:
        return self in (Operation.BULK, Operation.BULK_CANCEL, Operation.BULK_ROLLBACK)


_FIELDS = {
    Operation.REGISTER: {"version", "op", "request_id", "job", "spec"},
    Operation.UNREGISTER: {"version", "op", "request_id", "job", "cascade"},
    Operation.UPDATE_SPEC: {"version", "op", "request_id", "job", "spec", "interrupt"},
    Operation.PAUSE: {"version", "op", "request_id", "job"},
    Operation.RESUME: {"version", "op", "request_id", "job"},
    Operation.RESYNC: {"version", "op", "request_id", "job"},
    Operation.BULK: {
        *("version", "op", "request_id", "account_id", "selector", "operation"),
        *("spec", "interrupt"),
    },
    Operation.BULK_CANCEL: {"version", "op", "request_id", "account_id", "bulk_id"},
    Operation.BULK_ROLLBACK: {"version", "op", "request_id", "account_id", "bulk_id"},
}


@dataclass(frozen=True)
class LogRecord:
    """One Kafka message of the change log, with its coordinates."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: bytes | None
    value: bytes | None

    @property
    def coordinates(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class Command:
    """A decoded, validated change log message."""

    op: Operation
    request_id: str
    key: JobKey
    record: LogRecord
    spec: JobSpec | None = None
    """The full spec of a register."""
    spec_update: Mapping[str, Any] | None = None
    """The partial spec of an update_spec; merged with the current spec and validated
    when applied, since the current spec is only known then."""
    interrupt: bool = False
    cascade: bool = False
    """An unregister that drops the jobs downstream of the job too."""
    task: str | None = None
    """Set when a bulk operation's task applies the command (``<bulk id>#<task>``):
    the job's row then keeps the coordinates of its own last message."""
    job_id: int | None = None
    """The job id a bulk rollback's re-register gives the job."""


@dataclass(frozen=True)
class BulkCommand:
    """A decoded bulk message: a new bulk operation, or the cancel or rollback of one.

    The body of a new one (selector, operation, spec, interrupt) is checked by
    :mod:`lakeprop.bulk` when the service applies it, as an update_spec's partial
    spec is."""

    op: Operation
    request_id: str
    account_id: int
    bulk_id: str
    record: LogRecord
    body: Mapping[str, Any] = field(default_factory=dict)


def bulk_message_key(account_id: int, bulk_id: str) -> bytes:
    """Kafka key of a bulk operation's messages (the request, its cancel, its rollback)."""
    return f"bulk/{account_id}/{bulk_id}".encode()


def decode(record: LogRecord, max_bytes: int) -> Command | BulkCommand:
    """Decode and validate one change log message, or raise InvalidMessageError."""
    obj = _json_object(record, max_bytes)
    op, request_id = _envelope(obj)
    if op.bulk:
        return _bulk(obj, op, request_id, record)
    key = _job_key(obj, record)
    return _BODIES[op](obj, Command(op, request_id, key, record))


def _json_object(record: LogRecord, max_bytes: int) -> dict[str, Any]:
    """The message's value as a JSON object: bytes, size, UTF-8, JSON, object."""
    if record.value is None:
        raise InvalidMessageError("message has no value (a tombstone is not a change log entry)")
    if len(record.value) > max_bytes:
        raise InvalidMessageError(
            f"message is {len(record.value)} bytes, more than the limit of {max_bytes}",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    try:
        text = record.value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(
            f"message is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        detail = (
            f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else "nested too deeply"
        )
        raise InvalidMessageError(f"message is not valid JSON: {detail}") from None
    if not isinstance(obj, dict):
        raise InvalidMessageError(f"message must be a JSON object, got {type(obj).__name__}")
    return obj


def _envelope(obj: Mapping[str, Any]) -> tuple[Operation, str]:
    """Version, operation and request id."""
    version = obj.get("version")
    if version != ENVELOPE_VERSION or isinstance(version, bool):
        raise InvalidMessageError(
            f"unsupported envelope version {version!r}; this service reads version "
            f"{ENVELOPE_VERSION}",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    raw_op = obj.get("op")
    try:
        op = Operation(raw_op)
    except ValueError:
        raise InvalidMessageError(
            f"unknown operation {raw_op!r}; expected one of {[o.value for o in Operation]}",
            ErrorCode.UNKNOWN_OPERATION,
        ) from None
    unknown = sorted(set(obj) - _FIELDS[op])
    if unknown:
        raise InvalidMessageError(f"{op.value} message has unknown field(s) {unknown}")

    request_id = obj.get("request_id")
    if not isinstance(request_id, str) or not request_id.strip():
        raise InvalidMessageError("request_id must be a non-empty string")
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidMessageError(f"request_id is longer than {MAX_REQUEST_ID_LENGTH} characters")
    return op, request_id


def _check_key(record: LogRecord, expected: bytes, what: str) -> None:
    if record.key != expected:
        shown = None if record.key is None else record.key.decode("utf-8", "replace")[:200]
        raise InvalidMessageError(
            f"message key {shown!r} does not match the {what} {expected.decode()!r}; "
            f"one {what.split()[0]}'s messages must share its key to stay ordered"
        )


def _job_key(obj: Mapping[str, Any], record: LogRecord) -> JobKey:
    """The job key, checked against the message key."""
    if "job" not in obj:
        raise InvalidMessageError("message is missing field 'job'")
    key = JobKey.from_json(obj["job"])
    _check_key(record, key.message_key, "job key")
    return key


def _bulk(obj: Mapping[str, Any], op: Operation, request_id: str, record: LogRecord) -> BulkCommand:
    """A bulk message: account, bulk id (the request id of the bulk itself), and for
    a new bulk operation its selector, operation and parameters."""
    account_id = obj.get("account_id")
    if isinstance(account_id, bool) or not isinstance(account_id, int):
        raise InvalidMessageError(f"{op.value} message needs an integer account_id")
    JobKey(account_id, "x", "x", "x")  # the account id's range
    bulk_id = request_id if op is Operation.BULK else obj.get("bulk_id")
    if not isinstance(bulk_id, str) or not bulk_id.strip():
        raise InvalidMessageError(f"{op.value} message needs the bulk_id it applies to")
    _check_key(record, bulk_message_key(account_id, bulk_id), "bulk key")
    if op is not Operation.BULK:
        return BulkCommand(op, request_id, account_id, bulk_id, record)
    for name in ("selector", "operation"):
        if name not in obj:
            raise InvalidMessageError(f"bulk message is missing field {name!r}")
    body = {k: obj[k] for k in ("selector", "operation", "spec", "interrupt") if k in obj}
    return BulkCommand(op, request_id, account_id, bulk_id, record, body)


def _register_body(obj: Mapping[str, Any], command: Command) -> Command:
    if "spec" not in obj:
        raise InvalidSpecError("register message is missing field 'spec'")
    return replace(command, spec=JobSpec.from_json(obj["spec"]))


def spec_update_of(obj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The partial spec and interrupt flag of an update_spec (a message or a bulk body)."""
    spec_update = obj.get("spec")
    if not isinstance(spec_update, dict):
        raise InvalidSpecError("update_spec message needs a 'spec' object (a partial spec)")
    interrupt = obj.get("interrupt", False)
    if not isinstance(interrupt, bool):
        raise InvalidMessageError(f"interrupt must be true or false, got {interrupt!r}")
    return spec_update, interrupt


def _unregister_body(obj: Mapping[str, Any], command: Command) -> Command:
    cascade = obj.get("cascade", False)
    if not isinstance(cascade, bool):
        raise InvalidMessageError(f"cascade must be true or false, got {cascade!r}")
    return replace(command, cascade=cascade)


def _update_body(obj: Mapping[str, Any], command: Command) -> Command:
    spec_update, interrupt = spec_update_of(obj)
    return replace(command, spec_update=spec_update, interrupt=interrupt)


_BODIES: dict[Operation, Callable[[Mapping[str, Any], Command], Command]] = {
    Operation.REGISTER: _register_body,
    Operation.UNREGISTER: _unregister_body,
    Operation.UPDATE_SPEC: _update_body,
    Operation.PAUSE: lambda obj, command: command,
    Operation.RESUME: lambda obj, command: command,
    Operation.RESYNC: lambda obj, command: command,
}
"""The body of each operation, past the envelope."""


def best_effort_request_id(value: bytes | None) -> str | None:
    """The request id of a message that failed to decode, if one can be read at all."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_LENGTH else None


def encode(
    op: Operation,
    key: JobKey,
    *,
    spec: Mapping[str, Any] | None = None,
    interrupt: bool | None = None,
    cascade: bool | None = None,
    request_id: str | None = None,
) -> tuple[str, bytes, bytes]:
    """Build a message: (request id, Kafka key, JSON value)."""
    rid = request_id or uuid.uuid4().hex
    body: dict[str, Any] = {
        "version": ENVELOPE_VERSION,
        "op": op.value,
        "request_id": rid,
        "job": key.to_json(),
    }
    if spec is not None:
        body["spec"] = spec
    if interrupt is not None:
        body["interrupt"] = interrupt
    if cascade:
        body["cascade"] = True
    return rid, key.message_key, json.dumps(body, sort_keys=True).encode()


def encode_bulk(
    op: Operation,
    account_id: int,
    bulk_id: str | None = None,
    *,
    selector: Mapping[str, Any] | None = None,
    operation: str | None = None,
    spec: Mapping[str, Any] | None = None,
    interrupt: bool | None = None,
    request_id: str | None = None,
) -> tuple[str, bytes, bytes]:
    """Build a bulk message: (request id, Kafka key, JSON value). A new bulk
    operation's id is its request id; a cancel or rollback names ``bulk_id``."""
    rid = request_id or (bulk_id if op is Operation.BULK and bulk_id else uuid.uuid4().hex)
    target = rid if op is Operation.BULK else bulk_id
    if target is None:
        raise InvalidMessageError(f"{op.value} needs the bulk_id it applies to")
    body: dict[str, Any] = {
        "version": ENVELOPE_VERSION,
        "op": op.value,
        "request_id": rid,
        "account_id": account_id,
    }
    if op is Operation.BULK:
        if selector is None or operation is None:
            raise InvalidMessageError("a bulk operation needs a selector and an operation")
        body |= {"selector": dict(selector), "operation": operation}
    else:
        body["bulk_id"] = target
    if spec is not None:
        body["spec"] = spec
    if interrupt is not None:
        body["interrupt"] = interrupt
    return rid, bulk_message_key(account_id, target), json.dumps(body, sort_keys=True).encode()


def topic_max_message_bytes(kafka: KafkaConfig) -> int:
    """The topic's ``max.message.bytes``: twice the service's own limit.

    Above the service's limit, so that an oversized message reaches the
    service and is rejected there with a reason (10107) instead of being
    refused by the broker where nobody records it.
    """
    return 2 * kafka.max_message_bytes


def ensure_topic(kafka: KafkaConfig, timeout: float = 30.0) -> None:
    """Create the change log topic if it does not exist.

    Infinite retention (the log is the history of every job) and a
    ``max.message.bytes`` above the service's limit (:func:`topic_max_message_bytes`).
    """
    create_topic(
        kafka,
        kafka.topic,
        kafka.topic_partitions,
        {"retention.ms": "-1", "max.message.bytes": str(topic_max_message_bytes(kafka))},
        timeout,
    )
