"""A state table's Spark schema, derived from the dataclass of its rows.

Each row type is a frozen dataclass whose fields are the table's columns, in
order; :func:`spark_schema` reads their types, so the schema and the value
object cannot drift apart:

* ``int`` is a ``bigint``, :data:`Int32` an ``int``; ``float`` a ``double``,
  :data:`Float32` a ``float``; ``str``, ``bool``, ``bytes`` and ``datetime`` as
  Spark has them; a ``str`` enum is a string;
* ``X | None`` is nullable, and so is a field whose metadata says
  :data:`ADDED_LATER` (a column a later release added to an existing table);
* ``list[Row]`` of a dataclass is an array of structs whose fields are all
  nullable (Delta takes no NOT NULL constraint nested in an array).

:func:`row_tuple` gives a row's values in the same order, enums as their values.
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Union

from lakeprop.errors import PermanentError

Int32 = Annotated[int, "int32"]
"""A column stored as a 32-bit ``int``."""
Float32 = Annotated[float, "float32"]
"""A column stored as a 32-bit ``float``."""
ADDED_LATER = {"nullable": True}
"""Field metadata of a column added to an existing table: nullable there, whatever
the field's type (rows written before it have none)."""


def spark_schema(cls: type, *, nested: bool = False) -> Any:
    """The ``StructType`` of a row dataclass (see the module); with ``nested`` every
    field is nullable (a struct in an array)."""
    from pyspark.sql.types import StructField, StructType

    hints = typing.get_type_hints(cls, include_extras=True)
    return StructType(
        [
            StructField(
                f.name,
                spark_type(hints[f.name]),
                nested or _optional(hints[f.name]) or bool(f.metadata.get("nullable")),
            )
            for f in fields(cls)
        ]
    )


def _optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(
        hint
    )


def spark_type(hint: Any) -> Any:
    """The Spark type of one field's type hint."""
    from pyspark.sql import types as T

    if _optional(hint):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Annotated:
        mark = typing.get_args(hint)[1]
        return {"int32": T.IntegerType(), "float32": T.FloatType()}[mark]
    if typing.get_origin(hint) is list:
        (element,) = typing.get_args(hint)
        if is_dataclass(element):
            return T.ArrayType(spark_schema(element, nested=True), True)  # type: ignore[arg-type]
        return T.ArrayType(spark_type(element), True)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return T.StringType()
    simple = {
        int: T.LongType(),
        float: T.DoubleType(),
        str: T.StringType(),
        bool: T.BooleanType(),
        bytes: T.BinaryType(),
        datetime: T.TimestampType(),
    }
    if hint in simple:
        return simple[hint]
    raise PermanentError(f"no Spark type for {hint!r}")


def row_tuple(row: Any) -> tuple[Any, ...]:
    """A row dataclass's values in column order, enums as their values, nested rows
    as tuples."""

    def value(v: Any) -> Any:
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, list):
            return [value(x) for x in v]
        if is_dataclass(v) and not isinstance(v, type):
            return row_tuple(v)
        return v

    return tuple(value(getattr(row, f.name)) for f in fields(row))
