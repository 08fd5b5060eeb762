"""SQL conditions that reach the engine's queries, checked against a source's schema.

A condition (``auto_cdc``'s ``apply_as_deletes``, an expectation's ``check``)
must parse as one expression, reference only the source's columns, be a
boolean, be deterministic, and hold no subquery and no UDF. Spark's analyzer
decides, on an empty frame of the source's schema (no Spark job); the
expression tree is then walked for what it must not hold.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakeprop.errors import InvalidConsumerOptionsError

_FORBIDDEN = ("UDF", "Subquery", "PythonUDF", "ScalaUDF", "UserDefined", "Exists", "InSubquery")
"""Expression class names (by part) an expression must not hold."""


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
            f"{what} {text!r} is not deterministic: the same row must always get the same "
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
