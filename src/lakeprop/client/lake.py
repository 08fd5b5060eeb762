"""Spark-free reads of Delta tables: delta-rs opens them, Arrow holds the rows.

The read verbs (search, vector search, job status, usage, accounts, bulk
status) answer in about a second, process start included, because nothing here
starts a JVM: a local Spark session alone takes tens of seconds. Tables are
read by path (the service's state always lives by path; consumer targets do
under ``tables.resolution = "path"``) with the storage options delta-rs needs
(:func:`storage_of`). Nothing here imports PySpark.

Timestamps come back as Spark's ``collect`` gives them, naive in the local
time zone, so rows read here equal rows read through Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lakeprop.config import AppConfig
from lakeprop.errors import InvalidConfigError
from lakeprop.storage import Storage

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import DeltaTable


def uri(location: str) -> str:
    """A path as delta-rs takes it (``file:`` URIs become local paths)."""
    return location[len("file:") :] if location.startswith("file:/") else location


def storage_of(config: AppConfig) -> Storage:
    """How a client reaches the service's tables: its config's ``spark.hadoop.fs.s3a.*``
    settings and ``engine.native_storage_options`` (:mod:`lakeprop.storage`)."""
    return Storage.from_spark_conf(config.spark.conf, config.engine.native_storage_options)


class Lake:
    """Opens Delta tables by path with delta-rs, with the service's storage options."""

    def __init__(self, storage: Storage | None = None) -> None:
        try:
            import deltalake  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError:
            raise InvalidConfigError(
                "reading without Spark needs the deltalake and pyarrow packages: "
                "pip install 'lakeprop[native]'"
            ) from None
        self.storage = storage or Storage()

    def exists(self, path: str) -> bool:
        from deltalake import DeltaTable

        return bool(
            DeltaTable.is_deltatable(uri(path), storage_options=self.storage.options(path) or None)
        )

    def open(self, path: str) -> DeltaTable:
        from deltalake import DeltaTable

        return DeltaTable(uri(path), storage_options=self.storage.options(path) or None)

    def dataset(self, path: str) -> ds.Dataset:
        """The table's current version as an Arrow dataset."""
        return self.open(path).to_pyarrow_dataset()

    def read(self, path: str, columns: Sequence[str] | None = None, where: Any = None) -> pa.Table:
        """Rows of the table (``where``: an Arrow expression, pushed down to Parquet)."""
        dataset = self.dataset(path)
        present = set(dataset.schema.names)
        wanted = None if columns is None else [c for c in columns if c in present]
        return scan(dataset, wanted, where)

    def rows(
        self, path: str, columns: Sequence[str] | None = None, where: Any = None
    ) -> list[dict[str, Any]]:
        """:meth:`read` as Python rows, timestamps naive and local as Spark gives them."""
        return [local_times(r) for r in self.read(path, columns, where).to_pylist()]


def scan(dataset: ds.Dataset, columns: Sequence[str] | None, where: Any = None) -> pa.Table:
    """The rows of ``dataset`` read on this thread. Arrow's scanner threads can outlive
    a short process and abort it in interpreter teardown ("terminate called without
    an active exception"); the tables here are small enough to read on one thread."""
    return dataset.to_table(
        columns=None if columns is None else list(columns), filter=where, use_threads=False
    )


def local_times(value: Any) -> Any:
    """``value`` with every aware datetime in it made naive local time."""
    if isinstance(value, datetime):
        return value.astimezone().replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, dict):
        return {k: local_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [local_times(v) for v in value]
    return value
