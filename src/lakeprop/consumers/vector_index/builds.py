"""Index versions built in the background while tails go on against the live one.

One build per job configuration (its Delta transaction app id) at a time, on a
daemon thread of the service process: a crash or a shutdown loses it, and the
next iteration that finds the index drifted starts it again (the rows it had
written are replaced, never doubled). A thread that outlives its process's
ownership of the job runs on; the owner's switch fences it. The tail iteration
that finds a build finished fences its version, makes it equal to the live one
and switches the pointer (:class:`~lakeprop.consumers.vector_index.VectorIndexConsumer`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("lakeprop.vector_index")


@dataclass
class Build:
    """A new index version being written from the postings as of ``read_at``."""

    number: int
    """The index version it writes."""
    read_at: int
    """The postings table's Delta version it reads."""
    because: str
    result: Any = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.finished.is_set()


class Builds:
    """The builds running or finished in this process, by transaction app id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._builds: dict[str, Build] = {}

    def get(self, app_id: str) -> Build | None:
        with self._lock:
            return self._builds.get(app_id)

    def start(self, app_id: str, build: Build, work: Callable[[], Any]) -> Build:
        """Run ``work`` on a daemon thread; its result or error lands on ``build``."""

        def run() -> None:
            try:
                build.result = work()
            except BaseException as exc:  # reported to the next iteration
                log.warning("building index version %s of %s failed: %s", build.number, app_id, exc)
                build.error = exc
            finally:
                build.finished.set()

        with self._lock:
            self._builds[app_id] = build
        threading.Thread(target=run, name=f"index-build-{app_id}", daemon=True).start()
        return build

    def forget(self, app_id: str) -> None:
        with self._lock:
            self._builds.pop(app_id, None)

    def wait(self, prefix: str = "", timeout: float | None = None) -> bool:
        """Wait for the builds whose app id starts with ``prefix``; False on timeout."""
        with self._lock:
            running = [b for k, b in self._builds.items() if k.startswith(prefix)]
        return all(b.finished.wait(timeout) for b in running)


BUILDS = Builds()
"""This process's builds."""
