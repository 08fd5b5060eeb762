"""The ``kafka_changefeed`` messages of a change set, built in the driver.

The native path publishes what the Spark path publishes, message for message:
the same key and value JSON (Spark's ``to_json``: fields in column order, null
fields left out, doubles as Java writes them, ``"NaN"`` and ``"Infinity"`` as
strings, timestamps to the millisecond in the session time zone), the same op
per commit and key, and the same order for each key (by commit version, a
delete before the insert that follows it). Column types whose JSON this module
does not write as Spark does (:func:`unsupported`) keep a job on Spark.

Pure Python over rows as dictionaries: no Spark, and Arrow only where the
caller converts a change set (:func:`messages` takes ``Table.to_pylist()``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

PRIMITIVES = frozenset(
    {"boolean", "byte", "short", "integer", "long", "float", "double", "string", "date"}
)
"""Delta primitive types written here exactly as Spark's JSON writer writes them;
``timestamp`` and ``decimal(p,s)`` are too, and arrays of any of them (not of arrays)."""


def unsupported(fields: Iterable[tuple[str, Any]], key: Sequence[str]) -> str | None:
    """Why these (name, delta-rs type) columns, ``key`` the message key's, cannot be
    published natively, or None. The row holds the columns not starting with ``_``;
    the key's columns are written whatever their names, and must be scalars other
    than floating point (Spark groups a key's NaN as one value) named exactly as
    the source names them."""
    kinds = {name: (_kind(data_type), data_type) for name, data_type in fields}
    for name, (kind, data_type) in kinds.items():
        if (not name.startswith("_") or name in key) and kind is None:
            return f"column {name} of type {data_type} is published by Spark's JSON writer"
    for name in key:
        if name not in kinds:
            return f"primary key column {name} is named differently in the source"
        kind = kinds[name][0] or ""
        if kind.startswith("array") or kind in ("double", "float"):
            return f"primary key column {name} of kind {kind} is published by Spark"
    return None


def unsupported_settings(time_zone: str, conf: Callable[[str, str], str]) -> str | None:
    """Why the session's settings give JSON written here differently, or None:
    ``conf(name, default)`` reads one."""
    if time_zone not in UTC_NAMES:
        try:
            ZoneInfo(time_zone)
        except (ValueError, ZoneInfoNotFoundError):
            return f"session time zone {time_zone!r} is one only Spark reads"
    if conf("spark.sql.jsonGenerator.ignoreNullFields", "true").lower() != "true":
        return "spark.sql.jsonGenerator.ignoreNullFields is false"
    if conf("spark.sql.legacy.timeParserPolicy", "CORRECTED").upper() == "LEGACY":
        return "spark.sql.legacy.timeParserPolicy is LEGACY"
    if conf("spark.sql.files.supportSecondOffsetFormat", "true").lower() != "true":
        return "spark.sql.files.supportSecondOffsetFormat is false"
    return None


UTC_NAMES = frozenset({"UTC", "Z", "+00:00", "GMT", "Etc/UTC"})


def _kind(data_type: Any) -> str | None:
    """A delta-rs type's kind here (``double``, ``array<float>``), or None."""
    element = getattr(data_type, "element_type", None)
    if element is not None:
        inner = _kind(element)
        return None if inner is None or inner.startswith("array") else f"array<{inner}>"
    name = str(getattr(data_type, "type", ""))
    if name in PRIMITIVES or name == "timestamp":
        return name
    return "decimal" if name.startswith("decimal(") else None


def kinds_of_arrow(schema: Any) -> dict[str, str]:
    """Each column's kind, from the Arrow schema delta-rs reads a change set with."""
    import pyarrow as pa

    def kind(t: Any) -> str:
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return f"array<{kind(t.value_type)}>"
        for test, name in (
            (pa.types.is_boolean, "boolean"),
            (pa.types.is_integer, "long"),
            (pa.types.is_float32, "float"),
            (pa.types.is_float64, "double"),
            (pa.types.is_date, "date"),
            (pa.types.is_timestamp, "timestamp"),
            (pa.types.is_decimal, "decimal"),
        ):
            if test(t):
                return name
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return "string"
        raise TypeError(f"no JSON written here for Arrow type {t}")

    return {f.name: kind(f.type) for f in schema}


def java_double(value: float, digits: str | None = None) -> str:
    """``value`` as Java's ``Double.toString`` writes it (``1.0E10``, ``0.001``,
    ``1.0E-4``); ``digits``: its shortest decimal form, if not ``repr``'s."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign, figures, exponent = Decimal(digits or repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, figures))
    point = len(text) + exponent  # the decimal point's place after the first figure
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        if point <= 0:
            whole, fraction = "0", "0" * -point + text
        elif point >= len(text):
            whole, fraction = text + "0" * (point - len(text)), "0"
        else:
            whole, fraction = text[:point], text[point:]
        out = f"{whole}.{fraction}"
    else:
        out = f"{text[0]}.{text[1:] or '0'}E{point - 1}"
    return ("-" if sign else "") + out


def java_float(value: float) -> str:
    """A float (32-bit) value as Java's ``Float.toString`` writes it: its shortest
    decimal form among those that read back as the same float."""
    if value != value or value in (float("inf"), float("-inf")) or value == 0:
        return java_double(value)
    single = struct.unpack("f", struct.pack("f", value))[0]
    for precision in range(1, 10):
        digits = f"{single:.{precision}g}"
        if struct.unpack("f", struct.pack("f", float(digits)))[0] == single:
            return java_double(float(digits), digits)
    return java_double(single)


class Encoder:
    """Values as Spark's JSON writer writes them, by column kind (:func:`kinds_of_arrow`),
    timestamps in ``time_zone``."""

    def __init__(
        self,
        kinds: Mapping[str, str],
        time_zone: str,
        numbers: Callable[[str, list[float]], list[str]] | None = None,
    ) -> None:
        self.kinds = dict(kinds)
        self.zone = UTC if time_zone in UTC_NAMES else ZoneInfo(time_zone)
        self.numbers = numbers
        """``numbers(kind, values)``: the JVM's own ``Double.toString`` (``Float``'s
        for ``float``) of each value, as Spark's writer calls it (the JDK's choice of
        digits differs between releases); without it, the shortest form here."""
        self.written: dict[tuple[str, bytes], str] = {}

    def prepare(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Have ``numbers`` write every floating-point value of the rows, once a kind."""
        if self.numbers is None:
            return
        for kind in ("double", "float"):
            columns = [c for c, k in self.kinds.items() if k in (kind, f"array<{kind}>")]
            values: dict[bytes, float] = {}
            for row in rows:
                for column in columns:
                    value = row.get(column)
                    for v in value if isinstance(value, list) else [value]:
                        if v is not None:
                            values[_bits(kind, v)] = float(v)
            if values:
                texts = self.numbers(kind, list(values.values()))
                self.written.update({(kind, b): t for b, t in zip(values, texts, strict=True)})

    def value(self, column: str, value: Any) -> str:
        kind = self.kinds.get(column, "string")
        if kind.startswith("array<"):
            element = kind[len("array<") : -1]
            return "[" + ",".join(self._one(element, v) for v in value) + "]"
        return self._one(kind, value)

    def _one(self, kind: str, value: Any) -> str:
        if value is None:  # inside an array (a struct leaves its null fields out)
            return "null"
        if kind in ("double", "float"):
            text = self.written.get((kind, _bits(kind, value)))
            if text is None:
                text = java_double(float(value)) if kind == "double" else java_float(value)
            return f'"{text}"' if text in ("NaN", "Infinity", "-Infinity") else text
        if kind == "boolean":
            return "true" if value else "false"
        if kind == "timestamp":
            return quote(self.timestamp(value))
        if kind == "date":
            return quote(value.isoformat() if isinstance(value, date) else str(value))
        if kind == "decimal":
            return str(Decimal(value))
        if kind in ("byte", "short", "integer", "long"):
            return str(int(value))
        return quote(str(value))

    def timestamp(self, value: datetime) -> str:
        """``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` in the time zone, as Spark's JSON has it."""
        moment = _aware(value).astimezone(self.zone)
        offset = moment.utcoffset() or timedelta(0)
        zone = "Z" if offset == timedelta(0) else _offset(offset)
        return (
            f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
            f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}."
            f"{moment.microsecond // 1000:03d}{zone}"
        )

    def commit_timestamp(self, value: datetime) -> str:
        """A timestamp cast to a string, as Spark casts it: the session's local time,
        its fraction without trailing zeros."""
        moment = _aware(value).astimezone(self.zone)
        text = (
            f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
            f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
        )
        if moment.microsecond:
            text += "." + f"{moment.microsecond:06d}".rstrip("0")
        return text

    def struct(self, columns: Sequence[str], row: Mapping[str, Any]) -> str:
        """A struct of the columns, null fields left out."""
        parts = [f"{quote(c)}:{self.value(c, row[c])}" for c in columns if row.get(c) is not None]
        return "{" + ",".join(parts) + "}"


def _aware(value: datetime) -> datetime:
    """Arrow's naive timestamps (delta-rs's commit timestamps) are UTC instants."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _offset(offset: timedelta) -> str:
    """``XXXXX``, Spark 4's JSON offset: hours and minutes, and the seconds when
    there are any (``spark.sql.files.supportSecondOffsetFormat``, on by default)."""
    seconds = int(offset.total_seconds())
    sign = "+" if seconds >= 0 else "-"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")


def _bits(kind: str, value: float) -> bytes:
    """A floating-point value's bits: NaN and -0.0 kept apart as Java keeps them."""
    return struct.pack(">d" if kind == "double" else ">f", value)


_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES = {
    **{i: f"\\u{i:04X}" for i in range(0x20)},
    **{ord(c): e for c, e in _SHORT.items()},
}


def quote(text: str) -> str:
    """A JSON string as Jackson writes it: quote, backslash and control characters
    escaped (the latter in upper-case hex, but for the five short forms),
    everything else as it is."""
    return '"' + text.translate(_ESCAPES) + '"'


def operations(rows: Sequence[Mapping[str, Any]], key: Sequence[str]) -> list[str | None]:
    """Each change row's op, as the Spark path derives it: per commit and key, an
    update when both of an update's images carry the key, an insert (a delete)
    when only its post-image (pre-image) does; None for a row that publishes nothing."""
    images: dict[tuple[Any, ...], set[str]] = {}
    for row in rows:
        group = (*(row[k] for k in key), row["_commit_version"])
        images.setdefault(group, set()).add(row["_change_type"])
    out: list[str | None] = []
    for row in rows:
        kind = row["_change_type"]
        seen = images[(*(row[k] for k in key), row["_commit_version"])]
        if kind in ("insert", "delete"):
            out.append(kind)
        elif kind == "update_postimage":
            out.append("update" if "update_preimage" in seen else "insert")
        elif kind == "update_preimage" and "update_postimage" not in seen:
            out.append("delete")
        else:
            out.append(None)
    return out


def messages(
    rows: Sequence[Mapping[str, Any]], key: Sequence[str], encoder: Encoder
) -> list[tuple[str, str]]:
    """The (key, value) JSON messages of the change rows, each key's in publish
    order: by commit version, a delete before anything else of the same commit."""
    columns = [c for c in (rows[0] if rows else {}) if not c.startswith("_")]
    encoder.prepare(rows)
    out: list[tuple[str, int, int, str]] = []
    for row, op in zip(rows, operations(rows, key), strict=True):
        if op is None:
            continue
        value = [f'"op":"{op}"', f'"version":{int(row["_commit_version"])}']
        if row.get("_commit_timestamp") is not None:
            value.append(
                f'"commit_timestamp":{quote(encoder.commit_timestamp(row["_commit_timestamp"]))}'
            )
        value.append(f'"row":{encoder.struct(columns, row)}')
        rank = 0 if op == "delete" else 1
        body = "{" + ",".join(value) + "}"
        out.append((encoder.struct(key, row), int(row["_commit_version"]), rank, body))
    out.sort(key=lambda m: (m[0], m[1], m[2]))
    return [(k, v) for k, _, _, v in out]


def snapshot_messages(
    rows: Sequence[Mapping[str, Any]], key: Sequence[str], version: int, encoder: Encoder
) -> list[tuple[str, str]]:
    """The (key, value) JSON messages of a snapshot at ``version``: each row with op
    ``snapshot`` and no commit timestamp (Spark's writer leaves the null out)."""
    columns = [c for c in (rows[0] if rows else {}) if not c.startswith("_")]
    encoder.prepare(rows)
    out = [
        (
            encoder.struct(key, row),
            f'{{"op":"snapshot","version":{int(version)},"row":{encoder.struct(columns, row)}}}',
        )
        for row in rows
    ]
    out.sort(key=lambda m: m[0])
    return out
