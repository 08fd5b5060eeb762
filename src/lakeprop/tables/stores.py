"""The session's storage settings, and the start-up check of where the service writes.

:func:`session_storage` gathers what :class:`~lakeprop.storage.Storage` decides
with from the running session: the Delta log stores and Hadoop's ``fs.s3a.*``
settings however they were given (the config's ``[spark.conf]``, ``spark-submit
--conf``, ``core-site.xml``). :func:`check_storage` runs once at start:

* with ``cluster.enabled``, a state or table location whose commits do not
  exclude other Spark applications refuses the start, saying what to set: the
  instances' fencing rests on Delta's commit being exclusive;
* a location whose commits do not exclude delta-rs keeps the native path off for
  its tables (:func:`lakeprop.engine.native.plan_native` asks the same
  question per table, and the job's status says why), which is logged once here;
* a log store the settings name that is not on the classpath refuses the start
  (Delta would fail at the first commit instead).
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from lakeprop.config import AppConfig
from lakeprop.errors import InvalidConfigError
from lakeprop.storage import CommitSafety, Storage

log = logging.getLogger(__name__)


def session_storage(spark: SparkSession, config: AppConfig) -> Storage:
    """The storage settings in force in ``spark`` (the config's on top of none)."""
    conf: dict[str, str] = dict(config.spark.conf)
    hadoop: dict[str, str] = {}
    try:
        conf.update(dict(spark.sparkContext.getConf().getAll()))
        live = spark.sparkContext._jsc.hadoopConfiguration().getPropsWithPrefix("fs.s3a.")
        hadoop = {f"fs.s3a.{key}": str(value) for key, value in dict(live).items()}
    except Exception as exc:  # Spark Connect: no JVM of our own; the config is what we know
        log.debug("storage settings from the config only: %s", exc)
    return Storage.from_spark_conf(conf, config.engine.native_storage_options, hadoop)


def written_locations(spark: SparkSession, config: AppConfig) -> list[str]:
    """Where the service commits to Delta tables: its state, and the root of the
    tables (the path warehouse, or the metastore's warehouse for managed tables)."""
    locations = [config.state.location]
    if config.tables.resolution == "path":
        locations.append(config.tables.warehouse)
    else:
        warehouse = spark.conf.get("spark.sql.warehouse.dir", None)
        if warehouse:
            locations.append(warehouse)
    return locations


def check_storage(
    spark: SparkSession, storage: Storage, locations: list[str], *, cluster: bool
) -> list[CommitSafety]:
    """Refuse what is unsafe (see the module doc); the locations whose native path is off."""
    safeties = [storage.safety(location) for location in locations]
    if cluster:
        unsafe = [s for s in safeties if not s.across_instances]
        if unsafe:
            raise InvalidConfigError(
                "cluster.enabled needs commits that exclude other instances: "
                + "; ".join(s.why for s in unsafe)
            )
    for name in sorted({storage.log_store(location) for location in locations} - {""}):
        _require_class(spark, name)
    native_off = [s for s in safeties if not s.across_engines]
    for safety in native_off:
        log.warning("the native path is off for tables under %s: %s", safety.location, safety.why)
    return native_off


def _require_class(spark: SparkSession, name: str) -> None:
    from py4j.java_gateway import JavaClass

    try:
        found = spark.sparkContext._jvm
        for part in name.split("."):
            found = getattr(found, part)
    except Exception:  # Spark Connect: Delta reports a missing class at the first commit
        return
    if not isinstance(found, JavaClass):
        raise InvalidConfigError(
            f"the Delta log store {name} is not on the classpath: ship its jar "
            "(lakeprop-logstore, built by scripts/setup.sh) with --jars or spark.jars"
        )
