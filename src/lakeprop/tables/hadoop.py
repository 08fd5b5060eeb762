"""Files on any Hadoop file system (local, HDFS, object stores) through the JVM.

The Delta log probe and the checkpoint lease read and write small files by
path. Both go through :class:`HadoopFiles`, which keeps one ``FileSystem``
object per scheme and authority: creating one costs milliseconds, a cached
one's calls a fraction of that (on object stores each call is still a round
trip).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession


class HadoopFiles:
    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "HadoopFiles needs the JVM of a classic Spark session"
        self._jvm: Any = jvm
        self._conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
        self._fs: dict[str, Any] = {}

    def path(self, location: str, *children: str) -> Any:
        """The Hadoop ``Path`` of ``location`` (joined with ``children``)."""
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        for child in children:
            path = self._jvm.org.apache.hadoop.fs.Path(path, child)
        return path

    def filesystem(self, path: Any) -> Any:
        uri = path.toUri()
        key = f"{uri.getScheme()}://{uri.getAuthority()}"
        if key not in self._fs:
            self._fs[key] = path.getFileSystem(self._conf)
        return self._fs[key]

    def exists(self, path: Any) -> bool:
        return bool(self.filesystem(path).exists(path))

    def lines(self, path: Any) -> Iterator[str]:
        """The lines of a text file (none if it does not exist)."""
        fs = self.filesystem(path)
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

    def read_text(self, path: Any) -> str | None:
        """The whole file, or None if it does not exist."""
        fs = self.filesystem(path)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, path: Any, text: str) -> None:
        """Create or overwrite the file with ``text``."""
        stream = self.filesystem(path).create(path, True)
        try:
            stream.write(text.encode())
        finally:
            stream.close()

    def delete(self, path: Any) -> None:
        self.filesystem(path).delete(path, False)

    def names(self, path: Any) -> list[str]:
        """Names of the entries of a directory ([] when it does not exist)."""
        fs = self.filesystem(path)
        if not fs.exists(path):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(path)]
