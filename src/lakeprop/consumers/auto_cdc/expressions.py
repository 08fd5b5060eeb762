"""Registration checks of ``auto_cdc`` options against the source's schema.

``apply_as_deletes`` and ``apply_as_truncates`` are SQL that reaches every
iteration's query, so each must parse as one expression, reference only source
columns, be a boolean, be deterministic, and hold no subquery and no UDF
(:func:`~lakeprop.tables.conditions.check_condition`).
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import DataType, MapType, StructType

from lakeprop.consumers.auto_cdc.options import NAME, CdcOptions
from lakeprop.errors import InvalidConsumerOptionsError
from lakeprop.tables.conditions import check_condition


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
