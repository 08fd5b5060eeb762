"""One running service per checkpoint.

Two instances on one checkpoint would both apply the change log and both run
iterations, racing on every state table. The first instance to start takes a
lock in the checkpoint directory; a second one refuses to start, naming the
holder, once the holder has kept the lock for ``wait`` seconds (a restarted
instance may find its crashed predecessor's process still exiting).

* A local checkpoint (a plain path) gets an exclusive ``flock`` on
  ``<checkpoint>/lakeprop.service.lock``. The kernel drops it when the holder dies,
  however it dies, so a restart after a crash never waits.
* A checkpoint on a Hadoop file system (``s3a://``, ``abfss://``, ``dbfs:/``,
  ``file:/``...) gets a lease file, ``<checkpoint>/lakeprop.lease``, that the
  holder renews every ``ttl / 4`` seconds. A lease not renewed for ``ttl``
  seconds is stale and is taken over, so a restart after a crash waits at most
  ``ttl``.
* A Databricks FUSE path (``/Volumes/...``, ``/dbfs/...``) looks local but is
  shared by every cluster, where a ``flock`` is not: it gets the lease, on its
  ``dbfs:/`` form.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from pyspark.sql import SparkSession

from lakeprop.errors import ErrorCode, PermanentError
from lakeprop.tables.hadoop import HadoopFiles

log = logging.getLogger(__name__)

LOCK_FILE = "lakeprop.service.lock"
LEASE_FILE = "lakeprop.lease"
SHARED_MOUNTS = {"/Volumes/": "dbfs:/Volumes/", "/dbfs/": "dbfs:/"}
"""Databricks FUSE mounts: local-looking paths on shared storage, and their URIs."""


def shared_uri(location: str) -> str | None:
    """The ``dbfs:/`` URI of a path on a Databricks FUSE mount; None for other paths."""
    for mount, uri in SHARED_MOUNTS.items():
        if location.startswith(mount):
            return uri + location[len(mount) :]
    return None


class CheckpointInUseError(PermanentError):
    """Another instance of the service runs on this checkpoint."""

    default_code = ErrorCode.CHECKPOINT_IN_USE


def _owner() -> dict[str, Any]:
    return {
        "owner": uuid.uuid4().hex,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _refusal(location: str, holder: dict[str, Any]) -> CheckpointInUseError:
    who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    return CheckpointInUseError(
        f"checkpoint {location} is in use by another lakeprop instance ({who}, since "
        f"{holder.get('since', '?')}); stop that instance first, or give this one its own "
        "state.checkpoint_location and state.location"
    )


class CheckpointLock:
    """Held from :meth:`acquire` to :meth:`release` (or the end of the process)."""

    def __init__(
        self, spark: SparkSession, location: str, ttl: float = 60.0, wait: float = 0.0
    ) -> None:
        self.spark = spark
        self.location = (shared_uri(location) or location).rstrip("/")
        self.ttl = ttl
        self.wait = wait
        self.me = _owner()
        self._file: IO[str] | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._hadoop: HadoopFiles | None = None

    @property
    def local(self) -> bool:
        return "://" not in self.location and not self.location.split("/", 1)[0].endswith(":")

    def acquire(self) -> None:
        """Take the lock, waiting up to :attr:`wait` seconds for a holder to let go.

        A process killed a moment ago may still hold it: SIGKILL returns before the
        process has exited, and a supervisor that waited for its parent alone
        restarts the service within that moment.
        """
        take = self._acquire_flock if self.local else self._acquire_lease
        deadline = time.monotonic() + self.wait
        waiting = False
        while True:
            try:
                take()
                return
            except CheckpointInUseError as exc:
                if time.monotonic() >= deadline:
                    if not waiting:
                        raise
                    raise CheckpointInUseError(f"{exc} (waited {self.wait:g}s)") from None
                if not waiting:
                    log.warning("%s; waiting up to %gs for it to be released", exc, self.wait)
                    waiting = True
            time.sleep(0.1 if self.local else min(1.0, self.ttl / 10))

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._renewer is not None:
            self._stop.set()
            self._renewer.join(timeout=5)
            self._renewer = None
            try:
                if self._read_lease().get("owner") == self.me["owner"]:
                    self._files().delete(self._lease_path())
            except Exception as exc:  # the lease expires anyway
                log.warning("could not remove lease %s: %s", self._lease_path(), exc)

    # -- local: flock ---------------------------------------------------------------------

    def _acquire_flock(self) -> None:
        directory = Path(self.location)
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / LOCK_FILE, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read()
            handle.close()
            raise _refusal(self.location, _parse(text)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(self.me))
        handle.flush()
        self._file = handle

    # -- remote: lease --------------------------------------------------------------------

    def _files(self) -> HadoopFiles:
        if self._hadoop is None:
            self._hadoop = HadoopFiles(self.spark)
        return self._hadoop

    def _lease_path(self) -> str:
        return f"{self.location}/{LEASE_FILE}"

    def _read_lease(self) -> dict[str, Any]:
        """The lease, ``{}`` when there is none.

        A lease file that does not parse was caught half written (a file system
        where an overwrite is not atomic, as on HDFS or a local disk) or torn by
        a holder that died while writing it. It counts as renewed when it was
        last modified, by an unknown owner: a live holder's lease is never taken
        for absent, and a torn one goes stale like any other.
        """
        files = self._files()
        lease = _parse(files.read_text(self._lease_path()) or "")
        if "owner" in lease and "renewed" in lease:
            return lease
        modified = files.modified(self._lease_path())
        return {} if modified is None else {"owner": None, "renewed": modified}

    def _write_lease(self) -> None:
        self._files().write_text(
            self._lease_path(), json.dumps({**self.me, "renewed": time.time()})
        )

    def _acquire_lease(self) -> None:
        holder = self._read_lease()
        if holder and time.time() - float(holder.get("renewed", 0)) < self.ttl:
            raise _refusal(self.location, holder)
        self._write_lease()
        time.sleep(min(1.0, self.ttl / 10))  # let a racing writer's lease land, then check
        holder = self._read_lease()
        if holder.get("owner") != self.me["owner"]:
            raise _refusal(self.location, holder)
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="lakeprop-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                holder = self._read_lease()
                if holder.get("owner") not in (None, self.me["owner"]):
                    log.error(
                        "lease %s was taken over by pid %s on %s: this instance was not renewing "
                        "it and must be stopped",
                        self._lease_path(),
                        holder.get("pid"),
                        holder.get("host"),
                    )
                    return
                self._write_lease()
            except Exception as exc:
                log.warning("could not renew lease %s: %s", self._lease_path(), exc)


def _parse(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
