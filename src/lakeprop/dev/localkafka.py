"""A real Apache Kafka broker for development and tests (KRaft, single node).

The broker is the Maven Central ``kafka_2.13`` artifact, resolved by
``scripts/setup.sh`` into ``.cache/kafka.classpath``. It listens on 127.0.0.1
only, keeps its data in a directory of the caller's choosing (persistent for
local runs, temporary for tests), and is ready-checked with a metadata request
before :meth:`LocalKafka.start` returns.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from lakeprop.errors import BrokerError

_REPO_ROOT = Path(__file__).resolve().parents[3]  # src/lakeprop/dev/localkafka.py
CLASSPATH_FILE = Path(
    os.environ.get("LAKEPROP_KAFKA_CLASSPATH", _REPO_ROOT / ".cache" / "kafka.classpath")
)

_LOG4J2 = """\
Configuration:
  Appenders:
    File:
      name: FILE
      fileName: "{log}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: FILE
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists"; treat it as gone
    with contextlib.suppress(FileNotFoundError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def new_cluster_id() -> str:
    """A random KRaft cluster id (URL-safe base64 of a UUID).

    One that starts with ``-`` would be read as an option by the storage tool's
    argument parser (one id in 64), so, like Kafka's own ``Uuid.randomUuid``,
    draw again.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class LocalKafka:
    """Start, ready-check and stop one single-node KRaft broker."""

    def __init__(self, data_dir: str | Path, port: int | None = None, partitions: int = 3) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.partitions = partitions
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def classpath(self) -> str:
        """The broker's Java classpath, as `scripts/setup.sh` resolved it."""
        if not CLASSPATH_FILE.is_file():
            raise BrokerError(
                f"{CLASSPATH_FILE} is missing: run scripts/setup.sh to fetch the Kafka broker"
            )
        return CLASSPATH_FILE.read_text().strip()

    def _write_config(self, controller_port: int) -> Path:
        logs = self.data_dir / "logs"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(logs),
            "num.partitions": str(self.partitions),
            "auto.create.topics.enable": "true",
            # above the service's default kafka.max_message_bytes (1 MiB), so that
            # an oversized change log message is rejected by the service (10107),
            # also on a topic the broker created on first use
            "message.max.bytes": str(2 * 1_048_576),
            "log.retention.ms": "-1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # the membership group under KIP-848 runs the tests' short sessions, and
            # the rolling restarts' long ones
            "group.consumer.min.session.timeout.ms": "6000",
            "group.consumer.max.session.timeout.ms": "300000",
            "group.consumer.min.heartbeat.interval.ms": "1000",
        }
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.data_dir / "log4j2.yaml").write_text(_LOG4J2.format(log=self.log_file))
        return path

    def _java(self, *args: str) -> list[str]:
        return [
            "java",
            "-Xmx512m",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.yaml'}",
            "-cp",
            self.classpath(),
            *args,
        ]

    def running_pid(self) -> int | None:
        """Pid of a broker started on this data directory that is still alive."""
        pid = self._recorded_pid()
        return pid if pid is not None and _alive(pid) else None

    def start(self, timeout: float = 90.0) -> LocalKafka:
        """Format the data directory if new, start the broker and wait until it serves."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        stale = self.running_pid()
        if stale is not None:
            raise BrokerError(
                f"a broker (pid {stale}) already runs on {self.data_dir}; stop it first"
            )
        if _port_open(self.port):
            raise BrokerError(f"port {self.port} on 127.0.0.1 is already in use")
        config = self._write_config(free_port())
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id = new_cluster_id()
            done = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)
                ),
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise BrokerError(
                    f"formatting {self.data_dir} failed: {done.stderr or done.stdout}"
                )
        with open(self.data_dir / "broker.out", "ab") as out:
            self._process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for the app does not reach the broker
            )
        self.pid_file.write_text(str(self._process.pid))
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        # log_level 0: the probe's own connection errors while the broker boots are expected
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise BrokerError(f"broker exited with {self._process.returncode}: {self._tail()}")
            if _port_open(self.port):
                try:
                    metadata = admin.list_topics(timeout=2)
                    # ours, not another broker that took the port first (parallel tests)
                    if metadata.brokers and metadata.cluster_id == self._cluster_id():
                        return
                except Exception:  # not ready yet; KafkaException while it boots
                    pass
            time.sleep(0.3)
        self.stop()
        raise BrokerError(f"broker not ready after {timeout:.0f}s: {self._tail()}")

    def _cluster_id(self) -> str | None:
        """The cluster id the data directory was formatted with."""
        meta = self.data_dir / "logs" / "meta.properties"
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
        return None

    def _tail(self, lines: int = 20) -> str:
        text = ""
        for name in ("broker.out", "broker.log"):
            with contextlib.suppress(FileNotFoundError):
                text += (self.data_dir / name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the broker shuts down cleanly), SIGKILL if it does not in time.

        A broker this object started and that already exited is not signalled
        (its pid may belong to another process by now), and the pid file is
        removed only while it names the broker stopped here: a broker started
        since by someone else keeps its own.
        """
        started: int | None
        if self._process is not None:
            pid: int | None = None if self._process.poll() is not None else self._process.pid
            started = self._process.pid
        else:
            pid = started = self.running_pid()
        if pid is not None:
            self._terminate(pid, timeout)
        self._process = None
        if started is not None and self._recorded_pid() == started:
            self.pid_file.unlink(missing_ok=True)

    def _terminate(self, pid: int, timeout: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None:
                if self._process.poll() is not None:
                    return
            elif not _alive(pid):
                return
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if self._process is not None:
            self._process.wait(10)

    def _recorded_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
