"""A Spark standalone cluster on 127.0.0.1: one master and one worker, started
from the PySpark distribution (``spark-class``), for the test that submits the
service to a real cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

from devkit.spark import STACK
from devkit.waiting import assert_eventually
from lakeprop.dev.localkafka import free_port

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("LAKEPROP_VENV", ROOT / STACK.venv))


class StandaloneCluster:
    """``with StandaloneCluster(dir) as cluster:`` a master at :attr:`url` and one
    worker whose applications' directories are under :attr:`work_dir`."""

    def __init__(self, directory: Path, cores: int = 2, memory: str = "2g") -> None:
        self.directory = directory
        self.work_dir = directory / "work"
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 (the process owns it)
        env = {
            **os.environ,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # the master and the worker only route messages: compiling them with the
            # optimising JIT would take cores from the application under test
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        }
        self._processes.append(
            subprocess.Popen(
                [str(VENV / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def state(self) -> dict[str, object]:
        """The master's state, from its web UI's JSON."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return dict(json.load(r))

    def __enter__(self) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--webui-port", str(free_port())),
            *("--cores", str(self.cores), "--memory", self.memory),
            *("--work-dir", str(self.work_dir), self.url),
        )

        def worker_registered() -> None:
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster process exited: {self.logs()}")
            try:
                alive = self.state().get("aliveworkers")
            except (OSError, ValueError) as exc:
                # not listening yet, or its web UI answers the JSON path with its HTML
                # page while it starts (a fresh-clone run saw it)
                raise AssertionError(f"master not up yet: {exc}") from None
            assert alive == 1, alive

        try:
            assert_eventually(worker_registered, timeout=120, interval=0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """The worker, then the master: SIGTERM, and SIGKILL after 30 s."""
        for process in reversed(self._processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.directory.glob("*.log"))
        )

    def executor_dirs(self) -> list[Path]:
        """Every executor's directory: ``<work>/<app id>/<executor id>``."""
        return sorted(d for app in self.work_dir.glob("app-*") for d in app.iterdir() if d.is_dir())
