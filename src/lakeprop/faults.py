"""Named fault points: where crash tests make the process die or raise.

Off unless armed. Armed from the environment when the service starts::

    LAKEPROP_FAULTS="catalog.written=kill@3,iteration.between_consumers=raise"

``<point>=<action>[@<n>]`` fires on the n-th time the point is reached (default
the first), once. ``kill`` ends the process with SIGKILL at once, and its whole
process group when that group is a session of its own (``spark-submit.sh``
starts spark-submit that way), so the JVM dies too and nothing is flushed;
``raise`` raises :class:`InjectedFault`, a temporary error. With
``LAKEPROP_FAULTS_RECORD`` set, a point appends its name to that file before
it fires. With ``LAKEPROP_FAULTS_GATE`` set, ``lakeprop run`` builds its Spark
session and then waits for that file to exist before it touches any state: a
harness starts the next crashed service while the current one still runs, and
lets it in once that one is dead. Tests arm points
with :func:`arm`, ask which fired with :func:`fired` and clear them with
:func:`disarm`.

When nothing is armed a fault point is one call that tests an empty dict.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from lakeprop.errors import InvalidConfigError, TemporaryError

log = logging.getLogger(__name__)

ENV = "LAKEPROP_FAULTS"
RECORD_ENV = "LAKEPROP_FAULTS_RECORD"
"""A file each fault point appends its name to before it fires (for harnesses)."""
GATE_ENV = "LAKEPROP_FAULTS_GATE"
"""A file the service waits for, session built, before it starts (for harnesses)."""

POINTS = {
    "batch.decoded": "a change log batch is decoded, nothing of it written yet",
    "batch.recorded": "a change log batch's verdicts are written, the catalog not yet",
    "catalog.written": "a micro-batch wrote the catalog, the checkpoint not yet committed",
    "history.written": "finished iterations are in the history, their watermarks not yet",
    "iteration.before_write": "an iteration read its changes, no consumer wrote yet",
    "iteration.between_consumers": "one consumer of an iteration wrote, the next not yet",
    "iteration.after_writes": "every consumer wrote, the watermarks not yet advanced",
    "iteration.snapshot": "an initial sync (snapshot) is half written",
    "watermarks.flush": "the watermark flush is about to write",
    "gc.run": "garbage collection is about to delete dropped jobs",
    "bulk.written": "bulk tasks are written running (or a request recorded), the catalog not yet",
    "bulk.applied": "bulk tasks are applied in the catalog, not yet marked done",
    "index.written": "a vector index version is written, the pointer not yet switched to it",
    "auto_cdc.between_writes": "an SCD 2 range is in the target, its events not yet stored",
    "join_view.written": "a join view wrote its target, its joined tables' versions not yet kept",
}
ACTIONS = ("kill", "raise")


class InjectedFault(TemporaryError):
    """Raised by an armed ``raise`` fault point."""


@dataclass
class _Fault:
    action: str
    at_hit: int
    hits: int = 0
    fired: bool = False


_armed: dict[str, _Fault] = {}
_lock = threading.Lock()


def parse(spec: str) -> dict[str, tuple[str, int]]:
    """``point=action[@n],...`` -> {point: (action, n)}, or InvalidConfigError."""
    faults: dict[str, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, sep, rest = item.partition("=")
        action, _, count = rest.partition("@")
        if not sep or point not in POINTS:
            raise InvalidConfigError(
                f"{ENV}: unknown fault point in {item!r}; known: {sorted(POINTS)}"
            )
        if action not in ACTIONS:
            raise InvalidConfigError(f"{ENV}: action of {item!r} must be one of {ACTIONS}")
        if count and (not count.isdigit() or int(count) < 1):
            raise InvalidConfigError(f"{ENV}: hit count of {item!r} must be a positive integer")
        faults[point] = (action, int(count or 1))
    return faults


def arm(spec: str) -> None:
    """Arm the fault points ``spec`` names (replacing any armed before)."""
    parsed = parse(spec)
    with _lock:
        _armed.clear()
        _armed.update({p: _Fault(action, n) for p, (action, n) in parsed.items()})
    if parsed:
        log.warning("fault points armed: %s", spec)


def arm_from_env() -> None:
    arm(os.environ.get(ENV, ""))


def await_gate(poll: float = 0.1) -> None:
    """Wait until the file ``LAKEPROP_FAULTS_GATE`` names exists (if it names one)."""
    gate = os.environ.get(GATE_ENV)
    if not gate:
        return
    log.info("waiting for %s before starting", gate)
    while not os.path.exists(gate):
        time.sleep(poll)


def disarm() -> None:
    with _lock:
        _armed.clear()


def fired() -> set[str]:
    """The armed points that have fired (for harnesses running the service in-process)."""
    with _lock:
        return {name for name, fault in _armed.items() if fault.fired}


def fault_point(name: str) -> None:
    """Die or raise here if ``name`` is armed and due; otherwise nothing."""
    if _armed:
        _reach(name)


def _reach(name: str) -> None:
    with _lock:
        fault = _armed.get(name)
        if fault is None or fault.fired:
            return
        fault.hits += 1
        if fault.hits < fault.at_hit:
            return
        fault.fired = True
    log.warning("fault point %s: %s", name, fault.action)
    record = os.environ.get(RECORD_ENV)
    if record:  # stderr may not get out before the kill; a file does
        with open(record, "a") as out:
            out.write(f"{name}={fault.action}\n")
            out.flush()
            os.fsync(out.fileno())
    if fault.action == "raise":
        raise InjectedFault(f"injected fault at {name}")
    for handler in logging.getLogger().handlers:
        handler.flush()
    if os.getpgrp() == os.getsid(0):  # a session of our own: the JVM goes with us
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
