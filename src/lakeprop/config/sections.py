"""The configuration's sections, one dataclass each: validated as they are built."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from lakeprop.config.fields import (
    LOCAL_BOOTSTRAP,
    absolute,
    duration,
    is_duration,
    positive,
    topic_name,
)
from lakeprop.errors import InvalidConfigError


@dataclass(frozen=True)
class KafkaConfig:
    """The change log topic and how to reach it."""

    bootstrap_servers: str = LOCAL_BOOTSTRAP
    """The brokers of the change log (and of the notifications topic)."""
    topic: str = "lakeprop.changelog"
    """The change log topic."""
    topic_partitions: int = 3
    """Partitions of the change log when the service creates it."""
    create_topic: bool = True
    """Create the change log at start if it is missing (infinite retention)."""
    starting_offsets: str = "earliest"
    """Where a query without a checkpoint starts reading: ``earliest`` or ``latest``."""
    max_offsets_per_trigger: int = 10_000
    """Change log messages read per micro-batch at most."""
    max_message_bytes: int = 1_048_576
    """Larger change log messages are rejected (10107)."""
    wake_topic: str = ""
    """The topic the service writes to when it has work, which starts a micro-batch
    (one partition, a day's retention, created at start). Empty: ``<topic>.wake.<query
    name>``, with the instance id appended under ``cluster.enabled``."""
    delivery_timeout: float = duration(30.0)
    """How long the client waits for the broker to confirm a message."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Extra Kafka client properties (security.protocol, sasl.*): used by both the
    Spark source (prefixed ``kafka.``) and the producer of the client."""
    source_options: Mapping[str, str] = field(default_factory=dict)
    """Options of the Spark Kafka source only, verbatim: ``fetchOffset.numRetries``,
    ``kafka.default.api.timeout.ms`` (how long a broker outage takes to fail the query)."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise InvalidConfigError("kafka.bootstrap_servers must not be empty")
        topic_name(self.topic, "kafka.topic")
        if self.wake_topic:
            topic_name(self.wake_topic, "kafka.wake_topic")
        positive(self.topic_partitions, "kafka.topic_partitions")
        positive(self.max_offsets_per_trigger, "kafka.max_offsets_per_trigger")
        positive(self.max_message_bytes, "kafka.max_message_bytes")
        positive(self.delivery_timeout, "kafka.delivery_timeout")
        if self.starting_offsets not in ("earliest", "latest"):
            raise InvalidConfigError("kafka.starting_offsets must be 'earliest' or 'latest'")


@dataclass(frozen=True)
class LocalBrokerConfig:
    """The embedded development broker (local runs only)."""

    enabled: bool = False
    """Start the embedded broker with the service (``conf/local.toml``)."""
    data_dir: str = ".lakeprop/kafka"
    """Where the embedded broker keeps its data."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", absolute(self.data_dir))


@dataclass(frozen=True)
class StateConfig:
    """Where the service keeps its own Delta tables and the stream checkpoint."""

    location: str = ".lakeprop/state"
    """Where the service's Delta tables are (catalog, history, requests, rejects, ...)."""
    checkpoint_location: str = ".lakeprop/checkpoint"
    """The streaming query's checkpoint (the change log's offsets) and the instance lock."""
    lock_wait: float = duration(20.0)
    """Seconds a start waits for the checkpoint's lock held by another process (a
    crashed instance may still be exiting) before it refuses; on a lease (a
    checkpoint on object storage) at least ``lease_ttl`` and a renewal more, the
    time a crashed holder's lease takes to go stale."""
    lease_ttl: float = duration(60.0)
    """A checkpoint on object storage or another Hadoop file system is held by a lease
    renewed every quarter of this; one not renewed for this long is stale and is
    taken over (so a restart after a crash waits this long at most)."""
    catalog_merge_from: int = 20_000
    """The catalog size (rows, one per job) from which one instance MERGEs a write
    that changes rows the catalog holds, instead of writing the table whole: below
    it, serializing every row costs less than the MERGE's read and join. Rows the
    catalog does not hold yet (new jobs) are appended, whatever its size."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "location", absolute(self.location))
        object.__setattr__(self, "checkpoint_location", absolute(self.checkpoint_location))
        positive(self.lease_ttl, "state.lease_ttl")
        positive(self.catalog_merge_from, "state.catalog_merge_from")

    def table_path(self, name: str) -> str:
        return f"{self.location.rstrip('/')}/{name}"


@dataclass(frozen=True)
class TablesConfig:
    """How a job's (database, table) names a source Delta table.

    ``path``: ``<warehouse>/<database>/<table>`` (local runs, plain object stores).
    ``metastore``: the session catalog's ``database.table`` (Hive metastore, Unity
    Catalog; ``catalog`` optionally names the Unity Catalog).
    """

    resolution: str = "path"
    """``path``: a source is ``<warehouse>/<database>/<table>``; ``metastore``:
    ``database.table`` in the session catalog."""
    warehouse: str = ".lakeprop/warehouse"
    """The root of path-resolved tables."""
    catalog: str | None = None
    """The Unity Catalog of metastore-resolved tables (none: the session's default)."""

    def __post_init__(self) -> None:
        if self.resolution not in ("path", "metastore"):
            raise InvalidConfigError("tables.resolution must be 'path' or 'metastore'")
        object.__setattr__(self, "warehouse", absolute(self.warehouse))


@dataclass(frozen=True)
class SparkConfig:
    """How entry points build the SparkSession (ignored where one already exists)."""

    app_name: str = "lakeprop"
    """The Spark application's name."""
    master: str | None = None
    """Spark master URL (none: what ``spark-submit`` or the runtime gives)."""
    jars_dir: str | None = None
    """A directory of jars to put on the classpath (local runs: .cache/jars)."""
    packages: tuple[str, ...] = ()
    """Maven coordinates for spark.jars.packages (clusters without the jars)."""
    conf: Mapping[str, str] = field(default_factory=dict)
    """Spark settings, verbatim."""


@dataclass(frozen=True)
class EngineConfig:
    """Trigger selection, scheduler, retries and housekeeping."""

    enabled: bool = True
    """False: only apply the change log to the catalog (no iterations run)."""
    workers: int = 4
    """Iterations that run at once (one thread and FAIR pool each)."""
    max_versions_per_iteration: int = 1000
    """Chunked catch-up: a tail iteration covers at most this many source versions."""
    max_rows_per_iteration: int = 0
    """Chunked catch-up: a tail iteration covers at most this many change rows, as the
    commits' operation metrics in the Delta log count them (0: no bound). A single
    version is never split."""
    consumer_threads: int = 4
    """Consumers of one iteration that write at once (each on its own session)."""
    small_iteration_rows: int = 100_000
    """An iteration whose change set or snapshot holds at most this many rows runs its
    consumers without adaptive query execution, on the cluster's default parallelism
    of shuffle partitions: adaptive execution runs every shuffle stage as a Spark
    job of its own, which a small MERGE pays for and never gains from. A replica's
    MERGE there also reads the checkpointed change set without Delta's copy of
    its source (0: never)."""
    small_iterations: str = "auto"
    """``auto``: a tail of at most ``native_max_rows`` change rows, whose consumers all
    have a native path and whose tables delta-rs can write, runs in the driver
    with delta-rs instead of on Spark, and so does a snapshot of a table of at most
    as many rows whose consumers can write one; ``spark``: every iteration runs on
    Spark."""
    native_max_rows: int = 10_000
    """The largest change set (estimated from the commits' metrics), or table (by its
    files' row counts) for a snapshot, a native iteration takes."""
    native_storage_options: Mapping[str, str] = field(default_factory=dict)
    """How delta-rs reaches object stores from the driver (``AWS_REGION``,
    ``AZURE_STORAGE_ACCOUNT_NAME``, ...; values ``${NAME}`` from the environment)."""
    iteration_timeout: float = duration(3600.0)
    """An iteration running longer is cancelled (its Spark jobs too) and retried."""
    retry_base: float = duration(5.0)
    """First backoff of a job after a temporary error (doubling each time)."""
    retry_max: float = duration(300.0)
    """Longest backoff of a job after temporary errors."""
    watermark_flush_interval: float = duration(3600.0)
    """How often fresh watermark times of idle jobs are written to the catalog."""
    usage_refresh_interval: float = duration(300.0)
    """How often the usage table is recomputed for the hours that gained history rows
    (and at shutdown)."""
    status_flush_interval: float = duration(30.0)
    """How often the catalog table catches up with advanced watermarks and statuses.

    A watermark is durable once its iteration's history row is written (a
    restart rolls the catalog forward from the history, and the client reads
    it there too), so a tick that only advances watermarks commits no catalog.
    """
    identity_check_interval: float = duration(60.0)
    """How often an unchanged source's identity is read again (and at the first probe
    after a start): a table dropped and re-created at the version its jobs stand
    on looks unchanged otherwise."""
    gc_interval: float = duration(3600.0)
    """How often dropped jobs are collected."""
    gc_retention: float = duration(86400.0)
    """Dropped jobs' catalog rows are removed this long after their drop."""
    max_query_restarts: int = 20
    """A failed streaming query is restarted with backoff this many times in a row."""
    bulk_tasks_per_tick: int = 100
    """Tasks of bulk operations applied per micro-batch: a large bulk operation
    spreads over ticks, so it shows progress and a cancel lands in the middle."""
    bulk_task_attempts: int = 3
    """Tries of a bulk task that meets a temporary error before it fails."""

    def __post_init__(self) -> None:
        positive(self.workers, "engine.workers")
        positive(self.consumer_threads, "engine.consumer_threads")
        positive(self.max_versions_per_iteration, "engine.max_versions_per_iteration")
        if self.small_iteration_rows < 0:
            raise InvalidConfigError(
                "engine.small_iteration_rows must be 0 (never) or positive, "
                f"got {self.small_iteration_rows}"
            )
        if self.max_rows_per_iteration < 0:
            raise InvalidConfigError(
                "engine.max_rows_per_iteration must be 0 (no bound) or positive, "
                f"got {self.max_rows_per_iteration}"
            )
        positive(self.max_query_restarts, "engine.max_query_restarts")
        positive(self.bulk_tasks_per_tick, "engine.bulk_tasks_per_tick")
        positive(self.bulk_task_attempts, "engine.bulk_task_attempts")
        if self.small_iterations not in ("auto", "spark"):
            raise InvalidConfigError(
                f"engine.small_iterations must be 'auto' or 'spark', got {self.small_iterations!r}"
            )
        if self.native_max_rows < 0:
            raise InvalidConfigError("engine.native_max_rows must be 0 (never) or positive")
        for f in fields(self):
            if is_duration(f):
                positive(getattr(self, f.name), f"engine.{f.name}")


@dataclass(frozen=True)
class NotificationsConfig:
    """Commit notifications: writers announce "table T reached version v" on a topic.

    Off: every tick probes the Delta log of every table with an eligible job.
    On: a tick probes only the tables announced past a job's watermark, plus
    each table once per ``sweep_interval`` (writers that announce nothing).
    The topic lives on the change log's broker (``kafka`` settings).
    """

    enabled: bool = False
    """Probe only announced tables, plus a periodic sweep."""
    topic: str = "lakeprop.commits"
    """Where writers announce commits (created by the service, 1 day retention)."""
    sweep_interval: float = duration(60.0)
    """Every table is probed at least this often with notifications on."""

    def __post_init__(self) -> None:
        topic_name(self.topic, "notifications.topic")
        positive(self.sweep_interval, "notifications.sweep_interval")


@dataclass(frozen=True)
class ClusterConfig:
    """Several service instances sharing one change log and one state.

    Off (the default): one instance serves every table. On: each instance joins
    one Kafka consumer group on the membership topic, whose partitions are the
    ownership slots; Kafka's group coordinator assigns the slots (cooperative-
    sticky), and an instance serves the tables that hash onto its slots
    (:mod:`lakeprop.membership`). The topic lives on the change log's broker.
    """

    enabled: bool = False
    """Join the membership group and serve only the tables of the slots held."""
    instance_id: str = ""
    """This instance's name, unique in the cluster and stable across its restarts
    (its checkpoint is ``<state.checkpoint_location>/<instance_id>``); empty: the
    host name."""
    topic: str = ""
    """The membership topic (empty: ``<kafka.topic>.members``), created with
    ``slots`` partitions."""
    slots: int = 256
    """Ownership slots, the same for every instance: tables per instance vary with the
    slots per instance, so take tens of slots per instance (256 keeps 10 instances
    within 1.05x of a fair share; 100 instances need 4096)."""
    session_timeout: float = duration(10.0)
    """An instance not heard from for this long is dropped and its slots move (the
    broker's ``group.min.session.timeout.ms``, 6 s by default, is the floor)."""
    heartbeat_interval: float = duration(1.0)
    """How often an instance tells the group coordinator it is alive."""
    group_protocol: str = "classic"
    """Kafka's group protocol for the membership group: ``classic`` (any broker) or
    ``consumer`` (KIP-848, Kafka 4.0 and later: the broker assigns the slots, and the
    session timeout and heartbeat interval become the group's configs, within the
    broker's ``group.consumer.min/max.*`` bounds). Every instance uses the same."""
    static_membership: bool = False
    """Join as a static member (``group.instance.id`` is the instance id): an instance
    that stops and is back within ``session_timeout`` keeps its slots, so a rolling
    restart moves none. A stopped instance's slots then move only after the session
    timeout: set it above the time a restart takes."""

    def __post_init__(self) -> None:
        if self.topic:
            topic_name(self.topic, "cluster.topic")
        if self.instance_id and not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", self.instance_id
        ):
            raise InvalidConfigError(
                f"cluster.instance_id {self.instance_id!r} must be 1-64 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit (it names a directory)"
            )
        if self.group_protocol not in ("classic", "consumer"):
            raise InvalidConfigError(
                f"cluster.group_protocol must be 'classic' or 'consumer', "
                f"not {self.group_protocol!r}"
            )
        if not 1 <= self.slots <= 4096:
            raise InvalidConfigError(f"cluster.slots must be 1 to 4096, not {self.slots}")
        positive(self.session_timeout, "cluster.session_timeout")
        positive(self.heartbeat_interval, "cluster.heartbeat_interval")
        if self.heartbeat_interval * 3 > self.session_timeout:
            raise InvalidConfigError(
                "cluster.heartbeat_interval must be at most a third of cluster.session_timeout"
            )

    def members_topic(self, changelog_topic: str) -> str:
        return self.topic or f"{changelog_topic}.members"

    def instance(self) -> str:
        import socket

        return self.instance_id or re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:64]


@dataclass(frozen=True)
class EventsConfig:
    """The event table (``<state.location>/events``): the service's iterations, job
    errors, expectation counts and verdicts, one Delta row each, for notebooks."""

    enabled: bool = True
    """Write the event table."""
    flush_interval: float = duration(10.0)
    """Events are appended in one commit this often (and at a stop), on a thread of
    their own: an event reaches the table within it, whether or not a micro-batch
    follows."""
    retention: float = duration(30 * 86400.0)
    """Events older than this are deleted, once an hour."""

    def __post_init__(self) -> None:
        positive(self.flush_interval, "events.flush_interval")
        positive(self.retention, "events.retention")


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint of the driver (see the docs' "Metrics" page)."""

    enabled: bool = False
    """Serve Prometheus metrics on the driver."""
    host: str = "0.0.0.0"
    """Where the endpoint listens."""
    port: int = 9464
    """The endpoint's port (0 picks a free one)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidConfigError(f"metrics.port must be a TCP port, got {self.port}")
