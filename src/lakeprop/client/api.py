"""The Python client: register, update and drop jobs; read their status.

:class:`LakepropClient` is one facade over two parts that can also be used on
their own: :class:`~lakeprop.client.log.ChangeLogWriter` writes the change log
(a Kafka producer; no Spark needed), and :class:`~lakeprop.client.reads.StateReader`
reads the service's state tables and waits on them (a SparkSession), with the
waits of a pipeline in :class:`~lakeprop.client.chains.PipelineReader`.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from lakeprop.client.chains import PipelineReader
from lakeprop.client.log import ChangeLogWriter, Receipt, Repeats
from lakeprop.client.reads import LATEST, StateReader
from lakeprop.client.views import BulkStatus, JobInfo
from lakeprop.client.waiting import Progress, TableWatch, poll_until
from lakeprop.config import KafkaConfig, NotificationsConfig, StateConfig, TablesConfig

__all__ = [
    "LATEST",
    "BulkStatus",
    "ChangeLogWriter",
    "JobInfo",
    "LakepropClient",
    "PipelineReader",
    "Progress",
    "Receipt",
    "Repeats",
    "StateReader",
    "TableWatch",
    "poll_until",
]


class LakepropClient(ChangeLogWriter, PipelineReader):
    """Client of the change log (writes) and of the state tables (reads).

    Writes return a :class:`Receipt` once the broker confirmed the message;
    reads and waits need ``spark`` (or build one with ``getOrCreate``).
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        state_config: StateConfig | None = None,
        spark: SparkSession | None = None,
        tables: TablesConfig | None = None,
        notifications: NotificationsConfig | None = None,
    ) -> None:
        StateReader.__init__(self, state_config, spark, tables)
        ChangeLogWriter.__init__(self, kafka, notifications, self.source_version)
