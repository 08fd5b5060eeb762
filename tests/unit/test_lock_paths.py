"""Which checkpoint locations get a flock and which a lease (no Spark needed)."""

from __future__ import annotations

import pytest

from lakeprop.service.lock import CheckpointLock


@pytest.mark.parametrize(
    ("location", "local", "lease_at"),
    [
        ("/tmp/lakeprop/checkpoint", True, None),
        ("relative/checkpoint/", True, None),
        ("s3a://bucket/lakeprop/checkpoint", False, "s3a://bucket/lakeprop/checkpoint"),
        ("file:/tmp/checkpoint", False, "file:/tmp/checkpoint"),
        # Databricks FUSE paths look local but every cluster shares them
        ("/Volumes/main/lakeprop/checkpoint/", False, "dbfs:/Volumes/main/lakeprop/checkpoint"),
        ("/dbfs/lakeprop/checkpoint", False, "dbfs:/lakeprop/checkpoint"),
    ],
)
def test_shared_storage_gets_a_lease_and_only_a_local_disk_a_flock(
    location: str, local: bool, lease_at: str | None
) -> None:
    lock = CheckpointLock(None, location)  # type: ignore[arg-type]  # no Spark before acquire
    assert lock.local is local
    if lease_at is not None:
        assert lock.location == lease_at
