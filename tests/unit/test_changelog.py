"""Decoding change log messages (no Spark, no Kafka)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from lakeprop.changelog import (
    LogRecord,
    Operation,
    best_effort_request_id,
    decode,
    encode,
)
from lakeprop.errors import ErrorCode, InvalidMessageError
from lakeprop.spec import JobKey

KEY = JobKey(4, "db", "tbl", "job")
SPEC = {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}


def record(value: bytes | None, key: bytes | None = KEY.message_key) -> LogRecord:
    return LogRecord("log", 0, 12, datetime(2026, 1, 1), key, value)


def body(**changes: Any) -> bytes:
    obj: dict[str, Any] = {
        "version": 1,
        "op": "register",
        "request_id": "r1",
        "job": KEY.to_json(),
        "spec": SPEC,
    }
    obj.update(changes)
    return json.dumps({k: v for k, v in obj.items() if v is not ...}).encode()


def test_encode_then_decode_each_operation() -> None:
    for op, fields in [
        (Operation.REGISTER, {"spec": SPEC}),
        (Operation.UNREGISTER, {}),
        (Operation.UPDATE_SPEC, {"spec": {"iteration": {"priority": 1}}, "interrupt": True}),
    ]:
        rid, key, value = encode(op, KEY, **fields)
        command = decode(record(value, key), 10_000)
        assert (command.op, command.request_id, command.key) == (op, rid, KEY)
    assert command.spec_update == {"iteration": {"priority": 1}} and command.interrupt


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        (None, ErrorCode.INVALID_MESSAGE, "no value"),
        (b"x" * 101, ErrorCode.MESSAGE_TOO_LARGE, "101 bytes, more than the limit of 100"),
        (b"\xc3\x28", ErrorCode.INVALID_MESSAGE, "not UTF-8"),
        (b'{"version": 1,', ErrorCode.INVALID_MESSAGE, "not valid JSON"),
        (b"[" * 50 + b"]" * 50, ErrorCode.INVALID_MESSAGE, "must be a JSON object"),
        (b'"text"', ErrorCode.INVALID_MESSAGE, "must be a JSON object"),
        (body(version="1"), ErrorCode.UNSUPPORTED_VERSION, "version '1'"),
        (body(version=True), ErrorCode.UNSUPPORTED_VERSION, "version True"),
        (body(op="REGISTER"), ErrorCode.UNKNOWN_OPERATION, "unknown operation 'REGISTER'"),
        (body(extra=1), ErrorCode.INVALID_MESSAGE, "unknown field(s) ['extra']"),
        (body(request_id=""), ErrorCode.INVALID_MESSAGE, "request_id must be"),
        (body(request_id="r" * 200), ErrorCode.INVALID_MESSAGE, "longer than 128"),
        (body(job=...), ErrorCode.INVALID_MESSAGE, "missing field 'job'"),
        (body(job=[1]), ErrorCode.INVALID_SPEC, "job must be a JSON object"),
        (body(spec=...), ErrorCode.INVALID_SPEC, "missing field 'spec'"),
        (body(op="unregister", spec=SPEC), ErrorCode.INVALID_MESSAGE, "unknown field(s) ['spec']"),
        (body(op="update_spec", spec=None), ErrorCode.INVALID_SPEC, "partial spec"),
        (body(op="update_spec", interrupt="yes"), ErrorCode.INVALID_MESSAGE, "interrupt must"),
        (
            body(job={**KEY.to_json(), "name": "ünïcode"}),
            ErrorCode.INVALID_IDENTIFIER,
            "not a valid identifier",
        ),
    ],
)
def test_bad_messages_are_explained(value: bytes | None, code: ErrorCode, words: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        decode(record(value), 100 if code is ErrorCode.MESSAGE_TOO_LARGE else 10_000)
    assert info.value.code == code
    assert words in str(info.value)
    assert not info.value.is_temporary


def test_deeply_nested_json_is_rejected_not_crashing() -> None:
    with pytest.raises(InvalidMessageError, match="JSON"):
        decode(record(b"[" * 100_000 + b"]" * 100_000), 10**7)


def test_key_must_match_the_job() -> None:
    with pytest.raises(InvalidMessageError, match="does not match the job key"):
        decode(record(body(), key=b"4/db/tbl/other"), 10_000)
    with pytest.raises(InvalidMessageError, match="message key None"):
        decode(record(body(), key=None), 10_000)


def test_best_effort_request_id() -> None:
    assert best_effort_request_id(body(version=9)) == "r1"
    assert best_effort_request_id(b"nope") is None
    assert best_effort_request_id(b'{"request_id": 5}') is None
    assert best_effort_request_id(None) is None
