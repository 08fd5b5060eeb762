"""The local broker's cluster ids and pid file (no broker needed)."""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path

import pytest

from lakeprop.dev import localkafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first UUID drawn encodes to an id that begins with "-": it must be drawn again
    dash = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))
    plain = uuid.UUID(int=1)
    drawn = iter([dash, plain])
    monkeypatch.setattr(localkafka.uuid, "uuid4", lambda: next(drawn))
    assert base64.urlsafe_b64encode(dash.bytes).decode().startswith("-")
    assert localkafka.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_stopping_a_broker_that_already_exited_leaves_the_new_brokers_pid_file(
    tmp_path: Path,
) -> None:
    # the service's broker was stopped from outside, and another one started since
    ours = localkafka.LocalKafka(tmp_path)
    ours._process = subprocess.Popen(["true"])
    ours._process.wait()
    newer = subprocess.Popen(["sleep", "60"])
    try:
        ours.pid_file.write_text(str(newer.pid))
        ours.stop(timeout=5)
        assert ours.pid_file.read_text() == str(newer.pid)
        assert newer.poll() is None  # not signalled
        assert localkafka.LocalKafka(tmp_path).running_pid() == newer.pid
    finally:
        newer.kill()
        newer.wait()


def test_stopping_our_running_broker_removes_its_pid_file(tmp_path: Path) -> None:
    ours = localkafka.LocalKafka(tmp_path)
    ours._process = subprocess.Popen(["sleep", "60"])
    ours.pid_file.write_text(str(ours._process.pid))
    process = ours._process
    ours.stop(timeout=5)
    assert process.poll() is not None
    assert not ours.pid_file.exists()
