"""Copy the resolved Spark package jars that PySpark does not already ship.

Maven resolves Delta and the Kafka connector with all their dependencies; many of
those (Hadoop, Parquet, Jackson, log4j, Scala) are already in pyspark/jars at the
versions Spark was built with. Putting a second copy on the classpath invites
version clashes, so only artifacts PySpark lacks are kept.

Usage: select_jars.py SOURCE_DIR TARGET_DIR
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pyspark

_VERSION = re.compile(r"-\d[^-]*(-[^-]+)?\.jar$")


def artifact_id(jar: str) -> str:
    """`kafka-clients-3.9.0.jar` -> `kafka-clients`, `zstd-jni-1.5.7-3.jar` -> `zstd-jni`."""
    return _VERSION.sub("", jar)


def main(source: Path, target: Path) -> None:
    shipped = {artifact_id(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    target.mkdir(parents=True, exist_ok=True)
    kept = []
    for jar in sorted(source.glob("*.jar")):
        if artifact_id(jar.name) not in shipped:
            shutil.copy2(jar, target / jar.name)
            kept.append(jar.name)
    print(f"[setup] {len(kept)} jars in {target}: {', '.join(kept)}", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
