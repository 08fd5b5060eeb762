"""What the configuration's sections share: durations, paths and checks."""

from __future__ import annotations

import os
import re
from dataclasses import Field, field
from typing import Any

from lakeprop.errors import InvalidConfigError

LOCAL_BOOTSTRAP = "127.0.0.1:19092"
"""Where the embedded development broker listens when the local config is used."""


def duration(seconds: float) -> Any:
    """A setting given as a duration ("10s", "5m", "1h"), held in seconds; it must be
    positive. The field's metadata says so: what converts it reads that, not its name."""
    return field(default=seconds, metadata={"duration": True})


def is_duration(f: Field[Any]) -> bool:
    return bool(f.metadata.get("duration"))


def absolute(path: str) -> str:
    """Make a local relative path absolute; leave URIs (s3://, dbfs:/, file:/) alone."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path) or os.path.isabs(path):
        return path
    return os.path.abspath(path)


def positive(value: float, what: str) -> None:
    if value <= 0:
        raise InvalidConfigError(f"{what} must be positive, got {value}")


def topic_name(value: str, what: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", value):
        raise InvalidConfigError(f"{what} {value!r} is not a valid topic name")
