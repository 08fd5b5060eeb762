"""Delta's type widening: which column types a table can widen in place.

A change feed read across a widening (a smaller integer to a larger one, float
to double, a decimal to one of more precision) is read at the wider type; any
other change of a column's type is not.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
)

_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


def widens(old: DataType, new: DataType) -> bool:
    """Whether Delta's type widening turns ``old`` into ``new`` in place."""
    if isinstance(old, _INTEGERS) and isinstance(new, _INTEGERS):
        return _INTEGERS.index(type(new)) > _INTEGERS.index(type(old))
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    if isinstance(old, (ByteType, ShortType, IntegerType)) and isinstance(new, DoubleType):
        return True
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.precision - new.scale >= old.precision - old.scale and new.scale >= old.scale
    return False
