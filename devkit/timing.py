"""Where a test run's time goes: a pytest plugin the test command always loads.

For every test (set-up, call and teardown together) it records

* the wall time;
* the CPU its process tree spent (the test process, its Spark JVM, its broker and
  any service process it started, reaped or alive);
* the time the test's own thread slept waiting for something (``time.sleep`` on
  the main thread: polls, ticks, back-offs);
* how many services (:meth:`PropagationApp.start`) and processes it started.

The records travel on the tests' reports, so under ``pytest-xdist`` the
controller sees every worker's. At the end it prints a short summary (the
whole run, each module, the slowest tests) and, with ``LAKEPROP_TIMING=<file>``,
adds every record there as a JSON line (with the stack); ``LAKEPROP_TIMING_THREADS=1`` adds the
CPU of each JVM's threads by name (its compilers, its collector, Spark's tasks) at
the end, and ``LAKEPROP_TIMING_THREADS=<file>`` writes that of each worker's JVMs,
taken before its last teardown stops them, to ``<file>.<worker>``.

It only watches: no test behaves differently with it loaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

_HZ = os.sysconf("SC_CLK_TCK")
_PROPERTY = "lakeprop_timing"


def machine_busy_seconds() -> float:
    """CPU seconds the machine has spent busy (every core, every process) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:7]) - idle) / _HZ  # without steal: another tenant's


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _processes() -> dict[int, tuple[int, float]]:
    """Every process: its parent and the CPU it and its reaped children spent."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                f = _stat(entry.name)
            except OSError:
                continue
            found[int(entry.name)] = (int(f[1]), sum(int(x) for x in f[11:15]) / _HZ)
    return found


def tree_cpu(root: int) -> float:
    """CPU seconds spent by ``root`` and its descendants, alive or reaped."""
    processes = _processes()
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (parent, _) in processes.items():
        children[parent].append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += processes.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, ()))
    return total


@dataclass
class Counters:
    """What the code under test did, counted by the plugin's wrappers."""

    sleep: float = 0.0
    services: int = 0
    processes: int = 0


@dataclass
class Record:
    nodeid: str
    module: str
    worker: str = ""
    outcome: str = "passed"
    wall: float = 0.0
    cpu: float = 0.0
    sleep: float = 0.0
    services: int = 0
    processes: int = 0
    phases: dict[str, float] = field(default_factory=dict)


class Timing:
    """The plugin: wraps ``time.sleep``, the service's start and process creation for
    the run, and times each test from its set-up to its teardown."""

    def __init__(self, output: str | None, worker: str) -> None:
        self.output = output
        self.worker = worker
        self.records: dict[str, Record] = {}
        self.counters = Counters()
        self.started = time.monotonic()
        self.busy_start = machine_busy_seconds()
        self._main = threading.main_thread()
        self._undo: list[Callable[[], None]] = []
        self._services_counted = False
        self._open: dict[str, tuple[Record, dict[str, Any], float, float]] = {}

    # -- wrappers ---------------------------------------------------------------------

    def install(self) -> None:
        counters, main = self.counters, self._main
        real_sleep = time.sleep

        def sleep(seconds: float) -> None:
            if threading.current_thread() is main:
                counters.sleep += max(float(seconds), 0.0)
            real_sleep(seconds)

        time.sleep = sleep  # type: ignore[assignment]
        self._undo.append(lambda: setattr(time, "sleep", real_sleep))

        real_init = subprocess.Popen.__init__

        def popen_init(self_: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
            counters.processes += 1
            real_init(self_, *args, **kwargs)

        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(subprocess.Popen, "__init__", real_init))

    def count_services(self) -> None:
        """Count :meth:`PropagationApp.start` calls (imported at the first integration
        test: the unit tests must not need pyspark)."""
        self._services_counted = True
        from lakeprop.service.app import PropagationApp

        real_start = PropagationApp.start
        counters = self.counters

        def start(self_: Any, *args: Any, **kwargs: Any) -> Any:
            counters.services += 1
            return real_start(self_, *args, **kwargs)

        PropagationApp.start = start  # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(PropagationApp, "start", real_start))

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    # -- the tests' side (this process runs them) -------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if not self._undo:
            self.install()
        if not self._services_counted and "tests/unit/" not in item.nodeid:
            self.count_services()
        record = Record(item.nodeid, item.nodeid.split("::")[0], self.worker)
        self._open[item.nodeid] = (
            record,
            asdict(self.counters),
            time.monotonic(),
            tree_cpu(os.getpid()),
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        opened = self._open.get(item.nodeid)
        if opened is None:
            return
        record, before, wall, cpu = opened
        record.phases[call.when] = report.duration
        if report.failed:
            record.outcome = "failed"
        if call.when == "teardown":
            del self._open[item.nodeid]
            record.wall = time.monotonic() - wall
            record.cpu = tree_cpu(os.getpid()) - cpu
            after = asdict(self.counters)
            record.sleep = after["sleep"] - before["sleep"]
            record.services = after["services"] - before["services"]
            record.processes = after["processes"] - before["processes"]
            report.user_properties.append((_PROPERTY, asdict(record)))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Before the last teardown stops this process's JVMs: their threads' CPU, to
        ``<LAKEPROP_TIMING_THREADS>.<worker>`` when that names a file."""
        prefix = os.environ.get("LAKEPROP_TIMING_THREADS")
        if nextitem is None and prefix and prefix != "1":
            lines = jvm_threads(os.getpid())
            Path(f"{prefix}.{self.worker or 'main'}").write_text("\n".join(lines) + "\n")

    # -- the summary's side (the controller under xdist, else this process) -----------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == _PROPERTY:
                self.records[report.nodeid] = Record(**cast("dict[str, Any]", value))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker:
            return
        if os.environ.get("LAKEPROP_TIMING_THREADS"):
            for line in jvm_threads(os.getpid()):
                terminalreporter.write_line(line)
        if not self.records:
            return
        wall = time.monotonic() - self.started
        busy = machine_busy_seconds() - self.busy_start
        for line in summary(list(self.records.values()), wall, busy):
            terminalreporter.write_line(line)
        if self.output:
            path = Path(self.output)
            path.parent.mkdir(parents=True, exist_ok=True)
            stack = os.environ.get("LAKEPROP_STACK", "default")
            with path.open("a") as f:  # test.sh's parts and jobs add to one file
                for record in self.records.values():
                    f.write(json.dumps({"stack": stack, **asdict(record)}) + "\n")

    def pytest_unconfigure(self) -> None:
        self.uninstall()


def jvm_threads(pid: int, top: int = 20) -> list[str]:
    """CPU seconds of the threads of each JVM below ``pid``, grouped by thread name
    with numbers taken out (``C2 CompilerThread0`` and ``...1`` are one group)."""
    processes = _processes()
    children: dict[int, list[int]] = defaultdict(list)
    for child, (parent, _) in processes.items():
        children[parent].append(child)
    below, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        below.append(child)
        todo.extend(children.get(child, ()))
    lines = []
    for child in sorted(below):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() != "java":
                continue
        except OSError:
            continue
        groups: dict[str, float] = defaultdict(float)
        for task in Path(f"/proc/{child}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                fields = _stat(f"{child}/task/{task.name}")
            except OSError:
                continue
            groups[re.sub(r"[-#]?\d+", "#", name)] += (int(fields[11]) + int(fields[12])) / _HZ
        total = sum(groups.values())
        lines.append(f"-- threads of JVM {child}: {total:.0f} CPU s")
        for name, cpu in sorted(groups.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{cpu:>8.1f}  {name}")
    return lines


SESSION_NOTES: list[str] = []
"""Lines the tests' fixtures leave for the summary (the session JVM's own clocks)."""


def jvm_clocks(spark: Any) -> str:
    """How long the session's JVM spent collecting garbage and compiling, from its
    own management beans: CPU that no test's code asked for."""
    factory = spark._jvm.java.lang.management.ManagementFactory
    gc = sum(b.getCollectionTime() for b in factory.getGarbageCollectorMXBeans()) / 1000
    jit = factory.getCompilationMXBean().getTotalCompilationTime() / 1000
    heap = factory.getMemoryMXBean().getHeapMemoryUsage().getCommitted() / 2**20
    return f"session JVM: {gc:.0f} s in GC (pauses), {jit:.0f} s compiling, {heap:.0f} MiB heap"


def summary(records: list[Record], wall: float, busy: float, top: int = 12) -> list[str]:
    """The lines printed at the end of a run: the whole, each module, the slowest tests.

    ``cpu`` is each test's process tree; under xdist tests overlap, so the whole
    run's machine figure (``busy``) is the one that says how full the cores were."""
    cores = os.cpu_count() or 1
    modules: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        modules[r.module].append(r)
    workers = len({r.worker for r in records})
    lines = [
        "",
        f"== timing: {len(records)} tests on {workers} worker(s), {wall:.0f} s wall, "
        f"{busy:.0f} CPU s on the machine ({busy / max(wall, 1e-9):.2f} of {cores} cores), "
        f"{sum(r.cpu for r in records):.0f} CPU s in the tests, "
        f"{sum(r.sleep for r in records):.0f} s slept waiting, "
        f"{sum(r.services for r in records)} service starts, "
        f"{sum(r.processes for r in records)} processes started",
        *SESSION_NOTES,
        f"{'module':<52} {'tests':>5} {'wall s':>7} {'CPU s':>7} {'slept':>6} {'svc':>4}",
    ]
    by_wall = sorted(modules.items(), key=lambda kv: -sum(r.wall for r in kv[1]))
    for module, rs in by_wall:
        w = sum(r.wall for r in rs)
        if w < 5.0:
            continue
        lines.append(
            f"{module:<52} {len(rs):>5} {w:>7.1f} {sum(r.cpu for r in rs):>7.1f} "
            f"{sum(r.sleep for r in rs):>6.1f} {sum(r.services for r in rs):>4}"
        )
    lines.append(f"-- the {top} slowest tests (wall s, CPU s, slept s)")
    for r in sorted(records, key=lambda r: -r.wall)[:top]:
        lines.append(f"{r.wall:>7.1f} {r.cpu:>7.1f} {r.sleep:>6.1f}  {r.nodeid}")
    return lines


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("lakeprop-timing"):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        plugin = Timing(os.environ.get("LAKEPROP_TIMING"), worker)
        config.pluginmanager.register(plugin, "lakeprop-timing")
