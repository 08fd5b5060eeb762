"""Registration checks of ``auto_cdc`` options against the source's schema.

``apply_as_deletes`` and ``apply_as_truncates`` are SQL that reaches every
iteration's query, so each must parse as one expression, reference only source
columns, be a boolean, be deterministic, and hold no subquery and no UDF. Spark's
analyzer decides (on an empty frame of the source's schema: no Spark job); the
expression tree is then walked for what it must not hold.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, MapType, StructType

from lakeprop.consumers.auto_cdc.options import NAME, CdcOptions
from lakeprop.errors import InvalidConsumerOptionsError

_FORBIDDEN = ("UDF", "Subquery", "PythonUDF", "ScalaUDF", "UserDefined", "Exists", "InSubquery")
"""Expression class names (by part) an expression must not hold."""


def check_source(options: CdcOptions, schema: StructType, spark: SparkSession) -> None:
    """Raise InvalidConsumerOptionsError naming what in the options does not fit the source."""
    by_name = {f.name.lower(): f for f in schema.fields}
    if not options.table_source:
        for column in options.sequence_by:
            field = by_name.get(column.lower())
            if field is not None and not _orderable(field.dataType):
                raise InvalidConsumerOptionsError(
                    f"{NAME} sequence_by column {column} is of type "
                    f"{field.dataType.simpleString()}, which has no order"
                )
    for name in ("apply_as_deletes", "apply_as_truncates"):
        text = getattr(options, name)
        if text is not None:
            check_condition(spark, schema, text, f"{NAME} option {name}")


def _orderable(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return False
    if isinstance(data_type, StructType):
        return all(_orderable(f.dataType) for f in data_type.fields)
    return data_type.typeName() not in ("variant", "map")


def check_condition(spark: SparkSession, schema: StructType, text: str, what: str) -> None:
    """``text`` is a deterministic boolean SQL expression over ``schema``'s columns."""
    try:
        frame = spark.createDataFrame([], schema).select(F.expr(text).alias("condition"))
    except ParseException as exc:
        raise InvalidConsumerOptionsError(
            f"{what} {text!r} is not one SQL expression: {_first_line(exc)}"
        ) from None
    except AnalysisException as exc:
        raise InvalidConsumerOptionsError(
            f"{what} {text!r} does not resolve against the source's columns "
            f"{[f.name for f in schema.fields]}: {_first_line(exc)}"
        ) from None
    data_type = frame.schema["condition"].dataType
    if data_type.typeName() != "boolean":
        raise InvalidConsumerOptionsError(
            f"{what} {text!r} is of type {data_type.simpleString()}, not boolean"
        )
    expression = frame._jdf.queryExecution().analyzed().expressions().head()
    classes = _classes(expression)
    forbidden = sorted({c for c in classes if any(part in c for part in _FORBIDDEN)})
    if forbidden:
        raise InvalidConsumerOptionsError(
            f"{what} {text!r} holds {forbidden}: subqueries and user-defined functions are not "
            "allowed"
        )
    if not expression.deterministic():
        raise InvalidConsumerOptionsError(
            f"{what} {text!r} is not deterministic: the same event must always get the same "
            "answer, in every iteration and after a replay"
        )


def _classes(expression: Any) -> set[str]:
    """The class names of every node of a Catalyst expression tree (through py4j)."""
    found: set[str] = set()
    pending = [expression]
    while pending:
        node = pending.pop()
        found.add(str(node.getClass().getSimpleName()))
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    return found


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
