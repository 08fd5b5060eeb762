"""Small files by location on any file system: local paths directly, others through Hadoop.

The Delta log probe and the checkpoint lease read and write small files by
location. :func:`files_for` picks the cheapest way to reach a location:

* a local path (``/data/x`` or ``file:/data/x``) goes through ``os`` calls: an
  existence check costs microseconds;
* anything else (``s3a://``, ``abfss://``, ``hdfs://``, ``dbfs:/``) goes through the
  JVM's Hadoop ``FileSystem`` of the session, one cached object per scheme and
  authority (creating one costs milliseconds; on object stores each call is
  still a network round trip).

Both speak the same :class:`Files` protocol, in plain location strings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import SparkSession

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class Files(Protocol):
    def exists(self, location: str) -> bool: ...

    def lines(self, location: str) -> Iterator[str]:
        """The lines of a text file (none if it does not exist)."""
        ...

    def read_text(self, location: str) -> str | None:
        """The whole file, or None if it does not exist."""
        ...

    def write_text(self, location: str, text: str) -> None:
        """Create or overwrite the file with ``text``."""
        ...

    def delete(self, location: str) -> None: ...

    def names(self, location: str) -> list[str]:
        """Names of the entries of a directory ([] when it does not exist)."""
        ...

    def modified(self, location: str) -> float | None:
        """The file's modification time (seconds since the epoch, to the millisecond,
        as Hadoop's file systems give it), or None if it does not exist."""
        ...

    def move(self, location: str, target: str) -> None:
        """Move a file or directory to ``target`` (its parent is created; a rename
        where the file system has one, a copy and delete on an object store)."""
        ...


def local_path(location: str) -> str | None:
    """The local file system path of ``location``, or None when it is elsewhere."""
    if location.startswith("file://"):
        return location[len("file://") :] or "/"
    if location.startswith("file:"):
        return location[len("file:") :]
    return location if _SCHEME.match(location) is None else None


class LocalFiles:
    """:class:`Files` on the local file system."""

    @staticmethod
    def _path(location: str) -> str:
        path = local_path(location)
        assert path is not None, f"{location} is not a local path"
        return path

    def exists(self, location: str) -> bool:
        return os.path.exists(self._path(location))

    def lines(self, location: str) -> Iterator[str]:
        try:
            with open(self._path(location), encoding="utf-8") as handle:
                for line in handle:
                    yield line.rstrip("\n")
        except FileNotFoundError:
            return

    def read_text(self, location: str) -> str | None:
        try:
            return Path(self._path(location)).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, location: str, text: str) -> None:
        Path(self._path(location)).write_text(text, encoding="utf-8")

    def delete(self, location: str) -> None:
        Path(self._path(location)).unlink(missing_ok=True)

    def modified(self, location: str) -> float | None:
        try:
            return os.stat(self._path(location)).st_mtime_ns // 1_000_000 / 1000.0
        except FileNotFoundError:
            return None

    def names(self, location: str) -> list[str]:
        try:
            return os.listdir(self._path(location))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def move(self, location: str, target: str) -> None:
        destination = Path(self._path(target))
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(location), destination)


class HadoopFiles:
    """:class:`Files` through the JVM's Hadoop file systems (py4j)."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "HadoopFiles needs the JVM of a classic Spark session"
        self._jvm: Any = jvm
        self._conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
        self._fs: dict[str, Any] = {}

    def _resolve(self, location: str) -> tuple[Any, Any]:
        """(file system, path) of ``location``."""
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        uri = path.toUri()
        key = f"{uri.getScheme()}://{uri.getAuthority()}"
        if key not in self._fs:
            self._fs[key] = path.getFileSystem(self._conf)
        return self._fs[key], path

    def exists(self, location: str) -> bool:
        fs, path = self._resolve(location)
        return bool(fs.exists(path))

    def lines(self, location: str) -> Iterator[str]:
        fs, path = self._resolve(location)
        if not fs.exists(path):
            return
        stream = fs.open(path)
        try:
            reader = self._jvm.java.io.BufferedReader(
                self._jvm.java.io.InputStreamReader(stream, "UTF-8")
            )
            line = reader.readLine()
            while line is not None:
                yield str(line)
                line = reader.readLine()
        finally:
            stream.close()

    def read_text(self, location: str) -> str | None:
        fs, path = self._resolve(location)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def modified(self, location: str) -> float | None:
        """The file's modification time (seconds since the epoch), or None if it does
        not exist."""
        fs, path = self._resolve(location)
        if not fs.exists(path):
            return None
        return int(fs.getFileStatus(path).getModificationTime()) / 1000.0

    def write_text(self, location: str, text: str) -> None:
        fs, path = self._resolve(location)
        stream = fs.create(path, True)
        try:
            stream.write(text.encode())
        finally:
            stream.close()

    def delete(self, location: str) -> None:
        fs, path = self._resolve(location)
        fs.delete(path, False)

    def names(self, location: str) -> list[str]:
        fs, path = self._resolve(location)
        if not fs.exists(path):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(path)]

    def move(self, location: str, target: str) -> None:
        fs, path = self._resolve(location)
        _, destination = self._resolve(target)
        fs.mkdirs(destination.getParent())
        if not fs.rename(path, destination):
            raise OSError(f"could not move {location} to {target}")


class FilesFor:
    """Chooses :class:`LocalFiles` or :class:`HadoopFiles` per location."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._local = LocalFiles()
        self._hadoop: HadoopFiles | None = None

    def __call__(self, location: str) -> Files:
        if local_path(location) is not None:
            return self._local
        if self._hadoop is None:
            self._hadoop = HadoopFiles(self._spark)
        return self._hadoop
