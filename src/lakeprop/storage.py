"""Where tables live, how delta-rs reaches them, and whose commits exclude whose.

Delta commits version ``N`` of a table by creating ``_delta_log/N.json`` only if it
is absent. Whether that "only if" holds between two writers depends on the store
and on the log store each engine commits through (:meth:`Storage.safety`):

============  ==========================================  ==========  ==========
store         Spark's log store                           instances   delta-rs
============  ==========================================  ==========  ==========
local, HDFS   rename without overwrite (the default)      exclusive   exclusive
S3            ``S3SingleDriverLogStore`` (the default)    no          no
S3            lakeprop's ``S3ConditionalPutLogStore``     exclusive   exclusive
S3            Delta's ``S3DynamoDBLogStore``              exclusive   no
ADLS Gen2     ``AzureLogStore`` (rename if absent)        exclusive   exclusive
Azure Blob    ``AzureLogStore`` (no atomic rename)        no          no
GCS           ``GCSLogStore`` (generation precondition)   exclusive   exclusive
Databricks    its commit service (``s3``, ``dbfs``)       exclusive   no
============  ==========================================  ==========  ==========

"instances": several Spark applications (lakeprop instances, a paused one that
wakes up) commit to one table; "delta-rs": the native path commits beside Spark.
delta-rs itself commits with a conditional PUT on S3, ADLS and GCS.

delta-rs takes its S3 endpoint, region, path style and credentials from Hadoop's
``fs.s3a.*`` settings (:meth:`Storage.options`), so the two engines are configured
in one place; ``engine.native_storage_options`` adds to them (or replaces one).
Credentials otherwise come from the environment or the provider chain, which both
engines read.

Pure: no Spark, no I/O (the service gathers the settings from its session).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

CONDITIONAL_PUT_LOG_STORE = "io.lakeprop.delta.S3ConditionalPutLogStore"
"""lakeprop's log store for S3 (``tools/logstore``): every commit is a conditional PUT."""
DYNAMODB_LOG_STORE = "io.delta.storage.S3DynamoDBLogStore"
S3_SCHEMES = ("s3a", "s3", "s3n")
EXCLUSIVE_SCHEMES = ("file", "hdfs", "viewfs", "abfs", "abfss", "gs")
"""Stores whose default Delta log store and delta-rs both commit exclusively."""
BLOB_SCHEMES = ("wasb", "wasbs")
"""Azure Blob storage without a hierarchical namespace: no atomic rename."""
MANAGED_SCHEMES = ("dbfs",)
DATABRICKS_MOUNTS = ("/Volumes/", "/dbfs/")
"""Local-looking paths that are Databricks storage (FUSE mounts)."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def scheme(location: str) -> str:
    """``s3a`` for ``s3a://bucket/x``; ``file`` for a local path."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match and len(match.group(1)) > 1 else "file"


def bucket(location: str) -> str:
    """The bucket (authority) of an object store URI; empty for a path."""
    _, _, rest = location.partition("://")
    return rest.split("/", 1)[0] if rest else ""


@dataclass(frozen=True)
class CommitSafety:
    """Whether commits to one location exclude each other, and if not, what to set."""

    location: str
    across_instances: bool
    """Commits from several Spark applications exclude each other."""
    across_engines: bool
    """Spark's and delta-rs's commits exclude each other (the native path)."""
    why: str = ""
    """What is unsafe and what to set, when either is False."""


@dataclass(frozen=True)
class Storage:
    """The settings the service reaches its tables with, gathered once at start."""

    hadoop: Mapping[str, str] = field(default_factory=dict)
    """Hadoop's ``fs.s3a.*`` settings (as ``spark.hadoop.fs.s3a.*`` set them)."""
    log_stores: Mapping[str, str] = field(default_factory=dict)
    """Spark's ``spark.delta.logStore.*`` settings (Delta reads them from the Spark
    configuration the application started with, not from runtime settings)."""
    overrides: Mapping[str, str] = field(default_factory=dict)
    """``engine.native_storage_options``: delta-rs options that win over the derived ones."""
    databricks: bool = False
    """On a Databricks runtime (its commit service coordinates its own clusters)."""

    @classmethod
    def from_spark_conf(
        cls,
        conf: Mapping[str, str],
        overrides: Mapping[str, str] | None = None,
        hadoop: Mapping[str, str] | None = None,
    ) -> Storage:
        """From Spark settings (a config's ``[spark.conf]``, a session's), with the
        live Hadoop configuration's ``fs.s3a.*`` entries, where known, on top."""
        derived = {
            key.removeprefix("spark.hadoop."): value
            for key, value in conf.items()
            if key.startswith("spark.hadoop.fs.s3a.")
        }
        # Delta reads spark.delta.logStore.* and, failing that, delta.logStore.*
        log_stores = {f"spark.{k}": v for k, v in conf.items() if k.startswith("delta.logStore.")}
        log_stores.update({k: v for k, v in conf.items() if k.startswith("spark.delta.logStore.")})
        return cls(
            hadoop={**derived, **(hadoop or {})},
            log_stores=log_stores,
            overrides=dict(overrides or {}),
            databricks="DATABRICKS_RUNTIME_VERSION" in os.environ,
        )

    def log_store(self, location: str) -> str:
        """The log store class Delta on Spark commits to ``location`` with ("" for
        Delta's default for that scheme)."""
        return self.log_stores.get(
            f"spark.delta.logStore.{scheme(location)}.impl",
            self.log_stores.get("spark.delta.logStore.class", ""),
        )

    def safety(self, location: str) -> CommitSafety:
        """Whose commits to ``location`` exclude whose (the table in the module doc)."""
        kind = scheme(location)
        if kind in MANAGED_SCHEMES or (
            self.databricks and (kind in S3_SCHEMES or location.startswith(DATABRICKS_MOUNTS))
        ):
            return CommitSafety(
                location,
                True,
                False,
                f"{location} is committed to through Databricks' commit service, which "
                "delta-rs does not take part in",
            )
        if kind in S3_SCHEMES:
            return self._s3_safety(location, kind)
        if kind in BLOB_SCHEMES:
            return CommitSafety(
                location,
                False,
                False,
                f"{location} is Azure Blob storage, where Delta's commits exclude writers "
                "only inside one Spark application: use ADLS Gen2 (abfss://)",
            )
        if kind in EXCLUSIVE_SCHEMES:
            return CommitSafety(location, True, True)
        return CommitSafety(
            location,
            True,
            False,
            f"lakeprop does not know whether delta-rs's commits to {kind}:// exclude "
            "Spark's (the native path is off there)",
        )

    def _s3_safety(self, location: str, kind: str) -> CommitSafety:
        store = self.log_store(location)
        if store == CONDITIONAL_PUT_LOG_STORE:
            return CommitSafety(location, True, True)
        if store == DYNAMODB_LOG_STORE:
            return CommitSafety(
                location,
                True,
                False,
                f"{location} commits through {DYNAMODB_LOG_STORE}, whose lock table "
                f"delta-rs does not share: set spark.delta.logStore.{kind}.impl="
                f"{CONDITIONAL_PUT_LOG_STORE} for the native path",
            )
        named = store or "S3SingleDriverLogStore (Delta's default)"
        return CommitSafety(
            location,
            False,
            False,
            f"commits to {location} go through {named}, which checks that a commit is "
            "absent and then writes it: exclusive only inside one Spark application, "
            f"so another instance, or delta-rs, can overwrite a commit unseen. Set "
            f"spark.delta.logStore.{kind}.impl={CONDITIONAL_PUT_LOG_STORE} (the jar "
            "scripts/setup.sh builds from tools/logstore; docs: operations/object-storage)",
        )

    def options(self, location: str) -> dict[str, str]:
        """delta-rs storage options for ``location``: for S3, the endpoint, region,
        path style, plain HTTP and any credentials of Hadoop's ``fs.s3a.*``
        settings (a ``fs.s3a.bucket.<name>.*`` setting wins for its bucket); then
        ``engine.native_storage_options``."""
        derived: dict[str, str] = {}
        if scheme(location) in S3_SCHEMES:
            derived = _s3_options(self._s3a(bucket(location)))
        return {**derived, **self.overrides}

    def _s3a(self, name: str) -> dict[str, str]:
        """The ``fs.s3a.`` settings for one bucket, without their prefix."""
        settings = {
            key.removeprefix("fs.s3a."): value
            for key, value in self.hadoop.items()
            if key.startswith("fs.s3a.") and not key.startswith("fs.s3a.bucket.")
        }
        own = f"fs.s3a.bucket.{name}."
        settings.update(
            {
                key.removeprefix(own): value
                for key, value in self.hadoop.items()
                if key.startswith(own)
            }
        )
        return settings


_CREDENTIALS = {
    "access.key": "AWS_ACCESS_KEY_ID",
    "secret.key": "AWS_SECRET_ACCESS_KEY",
    "session.token": "AWS_SESSION_TOKEN",
}


def _s3_options(s3a: Mapping[str, str]) -> dict[str, str]:
    options: dict[str, str] = {}
    plain_http = s3a.get("connection.ssl.enabled", "true").strip().lower() == "false"
    endpoint = s3a.get("endpoint", "").strip()
    if endpoint:
        if "://" not in endpoint:
            endpoint = ("http://" if plain_http else "https://") + endpoint
        options["AWS_ENDPOINT_URL"] = endpoint
        plain_http = plain_http or endpoint.startswith("http://")
    if plain_http:
        options["AWS_ALLOW_HTTP"] = "true"
    region = s3a.get("endpoint.region", "").strip()
    if region:
        options["AWS_REGION"] = region
    if s3a.get("path.style.access", "").strip().lower() == "true":
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    for key, option in _CREDENTIALS.items():
        if s3a.get(key):
            options[option] = s3a[key]
    return options
