"""Schema evolution of an ``auto_cdc`` target without a full refresh.

Each range compares the columns its events carry (the source's, through the
column lists) with the target's:

* a column added to the source is added to the target (and to the event store
  or the column sequences that mirror it): existing rows hold NULL there;
* a type Delta can widen in place (a smaller integer to a larger one, float to
  double, a decimal to one of more precision) is widened, with Delta's type
  widening turned on for that table;
* a column the target has and the source lost (dropped, or renamed), any other
  type change, or key columns that differ from the options are a permanent error
  that says what changed. ``resync`` rebuilds the target from the source as it
  is now.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DataType,
    StructField,
    StructType,
)

from lakeprop.changes.widening import widens
from lakeprop.consumers.auto_cdc.options import NAME
from lakeprop.errors import ErrorCode, PermanentError
from lakeprop.identifiers import quote


class SchemaChangeError(PermanentError):
    default_code = ErrorCode.CONSUMER_FAILED


def evolve(
    spark: SparkSession,
    table: str,
    target: StructType,
    wanted: StructType,
    mirrored: Sequence[str] = (),
    what: str = "target",
) -> list[str]:
    """Bring ``table`` (of schema ``target``) to the columns of ``wanted``; the
    statements run. ``mirrored`` names struct columns of the target whose fields
    mirror the wanted columns (SCD type 1's column sequences): a field is added
    there too. Raises SchemaChangeError on what cannot evolve in place."""
    have = {f.name.lower(): f for f in target.fields}
    lost = [
        f.name
        for f in target.fields
        if f.name.lower() not in {w.name.lower() for w in wanted.fields}
        and not f.name.startswith("__")
    ]
    if lost:
        raise SchemaChangeError(
            f"{NAME}: the source no longer has column(s) {lost} that the {what} {table} keeps "
            "(dropped or renamed); resync the job to rebuild it from the source as it is now"
        )
    statements = []
    widened = False
    for field in wanted.fields:
        old = have.get(field.name.lower())
        if old is None:
            statements.append(_add(table, quote(field.name), field.dataType))
            statements += [
                _add(table, f"{quote(struct)}.{quote(field.name)}", sequence)
                for struct in mirrored
                if (sequence := _field_type_of(have.get(struct.lower()))) is not None
            ]
        elif old.dataType != field.dataType:
            if not widens(old.dataType, field.dataType):
                raise SchemaChangeError(
                    f"{NAME}: column {field.name} of the source changed type from "
                    f"{old.dataType.simpleString()} to {field.dataType.simpleString()}, which the "
                    f"{what} {table} cannot take in place; resync the job to rebuild it"
                )
            widened = True
            statements.append(
                f"ALTER TABLE {table} ALTER COLUMN {quote(field.name)} TYPE "
                f"{field.dataType.simpleString()}"
            )
    if widened:
        statements.insert(
            0, f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')"
        )
    for statement in statements:
        spark.sql(statement)
    return statements


def widen_sequence(
    spark: SparkSession, table: str, have: StructType, columns: Sequence[str], wanted: DataType
) -> list[str]:
    """Widen the sequence ``columns`` of ``table`` (of schema ``have``) to the events'
    sequence type ``wanted`` (Delta's type widening: the sequence column of an event
    source widened from int to bigint, say); the statements run. Another type change
    is a SchemaChangeError."""
    statements = []
    for name in columns:
        old = next((f.dataType for f in have.fields if f.name == name), None)
        if old is None or old == wanted:
            continue
        if not widens(old, wanted):
            raise SchemaChangeError(
                f"{NAME}: the sequence changed type from {old.simpleString()} to "
                f"{wanted.simpleString()}, which {table} cannot take in place; resync the job"
            )
        statements.append(
            f"ALTER TABLE {table} ALTER COLUMN {quote(name)} TYPE {wanted.simpleString()}"
        )
    if statements:
        statements.insert(
            0, f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')"
        )
    for statement in statements:
        spark.sql(statement)
    return statements


def _add(table: str, column: str, data_type: DataType) -> str:
    return f"ALTER TABLE {table} ADD COLUMNS ({column} {data_type.simpleString()})"


def _field_type_of(field: StructField | None) -> DataType | None:
    """The type of a struct column's fields (all alike: the column sequences')."""
    if field is None or not isinstance(field.dataType, StructType) or not field.dataType.fields:
        return None
    return field.dataType.fields[0].dataType


def check_keys(recorded: str | None, keys: Sequence[str], table: str) -> None:
    """The key columns the target was built for (a table property) are the options'."""
    if recorded is not None and recorded.lower() != ",".join(keys).lower():
        raise SchemaChangeError(
            f"{NAME}: the {table} was built for keys [{recorded}] and the job now names "
            f"{list(keys)}; resync the job to rebuild it for the new keys"
        )
