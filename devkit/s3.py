"""A real S3 API server on 127.0.0.1 for the tests, the chaos rounds and the benchmarks.

The server is S3Proxy (``scripts/setup.sh`` resolves it from Maven Central into
``.cache/s3proxy.classpath``) with its ``filesystem-nio2`` store: a bucket is a
directory under :attr:`LocalS3.data_dir`. It honours ``If-None-Match: *``
atomically, which every exclusive Delta commit on S3 rests on (S3Proxy 2.x accepted
the header and ignored it); a test proves it before anything relies on it
(``tests/integration/test_object_storage.py``).

Every request the server answers is written to ``requests.log``, with the S3
error it answered with: :meth:`LocalS3.counts` counts them by kind (LIST, HEAD,
GET, PUT, ...), which is how the benchmarks measure what a tick costs on object
storage, and :func:`log_audit` finds a Delta commit written twice.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from lakeprop.dev.localkafka import free_port

ROOT = Path(__file__).resolve().parents[1]
CLASSPATH_FILE = Path(
    os.environ.get("LAKEPROP_S3PROXY_CLASSPATH", ROOT / ".cache" / "s3proxy.classpath")
)
REGION = "us-east-1"

_LOGBACK = """\
<configuration>
  <appender name="REQUESTS" class="ch.qos.logback.core.FileAppender">
    <file>{requests}</file>
    <encoder><pattern>%thread|%msg%n</pattern></encoder>
  </appender>
  <appender name="SERVER" class="ch.qos.logback.core.FileAppender">
    <file>{server}</file>
    <encoder><pattern>%d %level %logger{{30}} %msg%n</pattern></encoder>
  </appender>
  <logger name="org.gaul.s3proxy.S3ProxyHandler" level="DEBUG" additivity="false">
    <appender-ref ref="REQUESTS"/>
  </logger>
  <root level="WARN"><appender-ref ref="SERVER"/></root>
</configuration>
"""

_REQUEST = re.compile(r"\{([A-Z]+)@\w+ \S+?://[^/]+(/\S*) HTTP/")
_ERROR = re.compile(r"sendSimpleErrorResponse: (\w+)")


@dataclass
class Request:
    """One request the server answered: its method, path and query, and the S3
    error it answered with ("" for a success)."""

    method: str
    target: str
    error: str = ""

    @property
    def kind(self) -> str:
        return request_kind(self.method, self.target)

    @property
    def key(self) -> str:
        """``bucket/key`` (no query); for a listing, ``bucket/prefix``."""
        path, _, query = self.target.partition("?")
        key = urllib.parse.unquote(path.lstrip("/"))
        if self.kind == "LIST":
            prefix = urllib.parse.parse_qs(query).get("prefix", [""])[0]
            key = f"{key.rstrip('/')}/{prefix}" if prefix else key
        return key


def request_kind(method: str, target: str) -> str:
    """``LIST``, ``GET``, ``HEAD``, ``PUT``, ``DELETE`` or ``POST`` for one request
    line (a GET on a bucket, with or without a query, lists it)."""
    path, _, _query = target.partition("?")
    if method == "GET" and path.strip("/").count("/") == 0:
        return "LIST"
    return method


class LocalS3:
    """Start, ready-check and stop one S3Proxy; ``with LocalS3(dir) as s3:``."""

    def __init__(self, data_dir: str | Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.access_key = "lakeprop-" + secrets.token_hex(4)
        self.secret_key = secrets.token_hex(16)
        """Made up per server: nothing is stored anywhere but in this process."""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store(self) -> Path:
        return self.data_dir / "buckets"

    @property
    def request_log(self) -> Path:
        return self.data_dir / "requests.log"

    def hadoop_conf(self) -> dict[str, str]:
        """The ``fs.s3a.*`` settings that reach this server (credentials included)."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": self.access_key,
            "fs.s3a.secret.key": self.secret_key,
        }

    def spark_conf(self) -> dict[str, str]:
        """:meth:`hadoop_conf` as Spark settings (``spark.hadoop.``), for a config file."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_conf().items()}

    def create_bucket(self, name: str) -> str:
        """A bucket (the filesystem store's buckets are its directories); its URI."""
        (self.store / name).mkdir(parents=True, exist_ok=True)
        return f"s3a://{name}"

    def requests(self) -> list[Request]:
        """Every request answered so far, in order. The server handles a request on one
        thread from start to end, so an error line belongs to the request its thread
        logged last."""
        answered: list[Request] = []
        current: dict[str, Request] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in self.request_log.read_text(errors="replace").splitlines():
                thread, _, message = line.partition("|")
                request = _REQUEST.search(message)
                if request:
                    current[thread] = Request(request.group(1), request.group(2))
                    answered.append(current[thread])
                    continue
                error = _ERROR.search(message)
                if error and thread in current:
                    current[thread].error = error.group(1)
        return answered

    def counts(self, since: int = 0) -> collections.Counter[str]:
        """Requests answered after the first ``since``, by :func:`request_kind`."""
        return collections.Counter(r.kind for r in self.requests()[since:])

    def classpath(self) -> str:
        if not CLASSPATH_FILE.is_file():
            raise RuntimeError(f"{CLASSPATH_FILE} is missing: run scripts/setup.sh")
        return CLASSPATH_FILE.read_text().strip()

    def start(self, timeout: float = 60.0) -> LocalS3:
        self.store.mkdir(parents=True, exist_ok=True)
        properties = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.access_key,
            "s3proxy.credential": self.secret_key,
            "jclouds.provider": "filesystem-nio2",
            "jclouds.filesystem.basedir": str(self.store),
        }
        config = self.data_dir / "s3proxy.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        config.chmod(0o600)
        logback = self.data_dir / "logback.xml"
        logback.write_text(
            _LOGBACK.format(requests=self.request_log, server=self.data_dir / "server.log")
        )
        with open(self.data_dir / "server.out", "ab") as out:
            self._process = subprocess.Popen(
                [
                    "java",
                    "-Xmx384m",
                    f"-Dlogback.configurationFile={logback}",
                    "-cp",
                    self.classpath(),
                    "org.gaul.s3proxy.Main",
                    "--properties",
                    str(config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"S3Proxy exited with {self._process.returncode}: {self._tail()}"
                )
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                return
            except urllib.error.HTTPError:
                return  # an S3 error (unsigned request): it serves
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"S3Proxy not ready after {timeout:.0f}s: {self._tail()}")

    def _tail(self, lines: int = 20) -> str:
        text = ""
        for name in ("server.out", "server.log"):
            with contextlib.suppress(FileNotFoundError):
                text += (self.data_dir / name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._process = None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


S3_AS_S3A_WITHOUT_LOG_STORE = {
    "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
}
"""``s3://`` served by S3A too: with no ``spark.delta.logStore.s3.impl`` set, Delta
commits there through its default S3 log store (absent-then-write), the store whose
commits exclude no other writer."""


def with_hadoop_conf(spark: object, conf: Mapping[str, str]) -> None:
    """Set ``conf`` on a running session's Hadoop configuration (S3A reads it when it
    first opens a bucket)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    for key, value in conf.items():
        hadoop.set(key, value)


_COMMIT = re.compile(r"^(?P<table>.+)/_delta_log/(?P<version>\d{20})\.json$")


def log_audit(s3: LocalS3) -> list[str]:
    """Every Delta table's log on the server checked for a lost commit: a commit file
    two writers both succeeded in writing (the second overwrote the first), and a
    version missing between a table's first and last commit files."""
    problems = []
    written: collections.Counter[str] = collections.Counter(
        r.key for r in s3.requests() if r.method == "PUT" and not r.error and _COMMIT.match(r.key)
    )
    problems += [f"{key} was written {n} times" for key, n in sorted(written.items()) if n > 1]
    versions: dict[str, set[int]] = collections.defaultdict(set)
    for path in s3.store.rglob("_delta_log/*.json"):
        match = _COMMIT.match(path.relative_to(s3.store).as_posix())
        if match:
            versions[match["table"]].add(int(match["version"]))
    for table, found in sorted(versions.items()):
        missing = sorted(set(range(min(found), max(found) + 1)) - found)
        if missing:
            problems.append(f"{table} lacks commit(s) {missing}")
    return problems
