"""Applying small change sets in the driver, with delta-rs, instead of a Spark MERGE.

A Spark MERGE of a few rows costs about a second on a small cluster: planning,
five Spark jobs and a commit. delta-rs (the ``deltalake`` package) MERGEs the same
rows into the same Delta table in tens of milliseconds, writes the change data
files when the target has its change feed on, and writes and reads Delta's
application transaction ids, so a native write is skipped on a replay exactly as
a Spark one is. The engine decides when an iteration goes this way
(:mod:`lakeprop.engine.native`); a consumer that can says so with
``Consumer.native`` and implements ``apply_changes_native`` with these helpers.

A target is written natively only when delta-rs can write every feature its
protocol uses (:func:`writable`); row tracking, domain metadata, identity and
generated columns, column mapping and deletion vectors are left to Spark. A
source's change feed is read natively only when delta-rs reads every feature
it uses (:func:`readable`): column mapping is left to Spark (delta-rs 1.6 does
not read a column-mapped change feed), deletion vectors are read (the operation
fuzzer compares delta-rs's change feed of deletion-vector commits with Spark's).
Both decide from the table's protocol, legacy versions included, and schema,
never by trying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lakeprop.errors import ErrorCode, PermanentError
from lakeprop.identifiers import validate_identifier
from lakeprop.storage import Storage
from lakeprop.tables.resolve import CHANGE_FEED_PROPERTY

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

NATIVE_WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "timestampNtz",
        "generatedColumns",  # only a table without any (checked in the schema)
    }
)
"""Writer features delta-rs writes as Spark does; a table using any other goes to Spark."""
NATIVE_READER_FEATURES = frozenset(
    {"deletionVectors", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"}
)
"""Reader features with which delta-rs reads a change feed as Spark does."""
MAX_READER_VERSION, MAX_WRITER_VERSION = 3, 7
LEGACY_WRITER_FEATURES = {
    1: frozenset(),
    2: frozenset({"appendOnly", "invariants"}),
    3: frozenset({"appendOnly", "invariants", "checkConstraints"}),
    4: frozenset(
        {"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"}
    ),
    5: frozenset(
        {
            *("appendOnly", "invariants", "checkConstraints", "changeDataFeed"),
            *("generatedColumns", "columnMapping"),
        }
    ),
    6: frozenset(
        {
            *("appendOnly", "invariants", "checkConstraints", "changeDataFeed"),
            *("generatedColumns", "columnMapping", "identityColumns"),
        }
    ),
}
"""The features a legacy writer version (below 7, no feature list) admits."""
LEGACY_READER_FEATURES = {1: frozenset(), 2: frozenset({"columnMapping"})}
"""The features a legacy reader version (below 3) admits."""
GENERATED = ("delta.generationExpression", "delta.identity.start", "delta.identity.step")
"""Column metadata of generated and identity columns."""


def available() -> bool:
    """Whether the ``deltalake`` and ``pyarrow`` packages are installed (the ``native`` extra)."""
    try:
        import deltalake  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def open_table(location: str, storage: Storage) -> DeltaTable:
    """``location`` opened with delta-rs, reached as ``storage`` says (:mod:`lakeprop.storage`)."""
    from deltalake import DeltaTable

    return DeltaTable(_uri(location), storage_options=storage.options(location) or None)


def _uri(location: str) -> str:
    """A local path as delta-rs takes it (``file:`` URIs included)."""
    return location[len("file:") :] if location.startswith("file:/") else location


def features(table: DeltaTable) -> tuple[frozenset[str], frozenset[str]]:
    """The table's (reader, writer) features: its lists from version 3 and 7 on, what
    its legacy versions admit below them."""
    protocol = table.protocol()
    reader = (
        frozenset(protocol.reader_features or ())
        if protocol.min_reader_version >= 3
        else LEGACY_READER_FEATURES.get(protocol.min_reader_version, frozenset({"unknown"}))
    )
    writer = (
        frozenset(protocol.writer_features or ())
        if protocol.min_writer_version >= 7
        else LEGACY_WRITER_FEATURES.get(protocol.min_writer_version, frozenset({"unknown"}))
    )
    return reader, writer


def _versions(table: DeltaTable) -> str | None:
    protocol = table.protocol()
    if protocol.min_reader_version > MAX_READER_VERSION:
        return f"reader version {protocol.min_reader_version}"
    if protocol.min_writer_version > MAX_WRITER_VERSION:
        return f"writer version {protocol.min_writer_version}"
    return None


def _generated_columns(table: DeltaTable) -> list[str]:
    return [f.name for f in table.schema().fields if any(g in f.metadata for g in GENERATED)]


def writable(table: DeltaTable) -> str | None:
    """Why delta-rs must not write ``table`` (a feature it does not write as Spark
    does, legacy protocol versions included), or None when it may."""
    version = _versions(table)
    if version is not None:
        return version
    reader, writer = features(table)
    unknown = sorted((reader | writer) - NATIVE_WRITER_FEATURES)
    if unknown:
        return f"table features {unknown} (protocol {_protocol(table)})"
    generated = _generated_columns(table)
    if generated:
        return f"generated or identity column(s) {generated}"
    return None


def readable(table: DeltaTable) -> str | None:
    """Why delta-rs must not read ``table``'s change feed (a feature it does not read
    as Spark does), or None when it may."""
    version = _versions(table)
    if version is not None:
        return version
    reader, writer = features(table)
    mapped = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if "columnMapping" in reader | writer and mapped != "none":
        return f"column mapping ({mapped} mode), whose change feed delta-rs does not read"
    unknown = sorted(reader - NATIVE_READER_FEATURES - {"columnMapping"})
    if unknown:
        return f"reader features {unknown} (protocol {_protocol(table)})"
    return None


def _protocol(table: DeltaTable) -> str:
    protocol = table.protocol()
    return f"({protocol.min_reader_version},{protocol.min_writer_version})"


class TargetAlteredError(PermanentError):
    """The target lacks a column the job writes: altered underneath the job."""

    default_code = ErrorCode.CONSUMER_FAILED


def check_columns(table: DeltaTable, columns: Sequence[str]) -> None:
    """Raise :class:`TargetAlteredError` when ``table`` lacks one of ``columns`` (as
    a Spark MERGE fails to resolve them), before anything is written."""
    present = {f.name.lower() for f in table.schema().fields}
    missing = [c for c in columns if c.lower() not in present]
    if missing:
        raise TargetAlteredError(
            f"Cannot resolve column(s) {missing} in the target {table.table_uri}, which has "
            f"{sorted(present)} (a retry will not fix this: repair the target table, or "
            "update or re-register the job)"
        )


def quoted(column: str) -> str:
    """A column name in a delta-rs (DataFusion) predicate."""
    return '"' + validate_identifier(column, "column") + '"'


def plain(table: pa.Table) -> pa.Table:
    """``table`` with Arrow's view types (which delta-rs reads strings and binaries
    as, and which pyarrow's compute kernels do not all take) cast to the plain ones."""
    import pyarrow as pa

    def plain_type(data_type: pa.DataType) -> pa.DataType:
        if pa.types.is_string_view(data_type):
            return pa.string()
        if pa.types.is_binary_view(data_type):
            return pa.binary()
        if pa.types.is_struct(data_type):
            return pa.struct([f.with_type(plain_type(f.type)) for f in data_type])
        if pa.types.is_list(data_type) or pa.types.is_list_view(data_type):
            return pa.list_(plain_type(data_type.value_type))
        return data_type

    schema = pa.schema([f.with_type(plain_type(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def applied(table: DeltaTable, app_id: str, version: int) -> bool:
    """Whether this job's write of ``version`` (or a later one) is in the table."""
    done = table.transaction_version(app_id)
    return done is not None and done >= version


def merge_changes(
    table: DeltaTable,
    latest: pa.Table,
    key: Sequence[str],
    columns: Sequence[str],
    app_id: str,
    version: int,
) -> int:
    """MERGE the last change per key into ``table`` (delete, update, insert) in one
    commit that records the job's transaction ``version``; the rows it changed."""
    from deltalake import CommitProperties, Transaction

    check_columns(table, [*key, *columns])
    source = latest.select([*columns, "_change_type"])
    on = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in key)
    values = {quoted(c): f"s.{quoted(c)}" for c in columns}
    metrics: Mapping[str, Any] = (
        table.merge(
            source,
            on,
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
        )
        .when_matched_delete("s._change_type = 'delete'")
        .when_matched_update(values)
        .when_not_matched_insert(values, "s._change_type != 'delete'")
        .execute()
    )
    return rows_changed(metrics)


def rows_changed(metrics: Mapping[str, Any]) -> int:
    """The target rows a delta-rs MERGE inserted, updated or deleted, by its metrics."""
    return sum(
        int(metrics.get(name) or 0)
        for name in (
            "num_target_rows_inserted",
            "num_target_rows_updated",
            "num_target_rows_deleted",
        )
    )


def nullable(table: pa.Table) -> pa.Table:
    """``table`` with every column (and array element) nullable and no field metadata,
    as Spark makes a table it creates from a DataFrame (Delta's ``asNullable``)."""
    import pyarrow as pa

    def loose(data_type: pa.DataType) -> pa.DataType:  # an array's elements too
        if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
            return pa.list_(pa.field("element", loose(data_type.value_type), nullable=True))
        return data_type

    schema = pa.schema([pa.field(f.name, loose(f.type), nullable=True) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def overwrite(
    location: str,
    rows: pa.Table,
    storage: Storage,
    app_id: str,
    version: int,
    change_feed: bool,
) -> None:
    """Replace the table at ``location`` (made when missing) with ``rows`` and their
    schema in one commit that records the job's transaction ``version``; nothing
    when that write (or a later one) is there already, as Spark's idempotent
    overwrite skips it. A new table gets its change feed on with ``change_feed``."""
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    existing: DeltaTable | None
    try:
        existing = open_table(location, storage)
    except TableNotFoundError:
        existing = None
    if existing is not None and applied(existing, app_id, version):
        return
    write_deltalake(
        existing if existing is not None else _uri(location),
        nullable(rows),
        mode="overwrite",
        schema_mode="overwrite",
        configuration={CHANGE_FEED_PROPERTY: "true"} if change_feed else None,
        storage_options=storage.options(location) or None,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
    )
