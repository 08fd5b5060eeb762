"""The local broker's cluster ids (no broker needed)."""

from __future__ import annotations

import base64
import uuid

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
