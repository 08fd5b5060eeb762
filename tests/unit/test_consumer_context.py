"""A consumer's context without Spark: its Delta transaction id, the session
confs it sets around its Delta writes, and where its last changes per key come from."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from lakeprop.consumers.base import MERGE_MATERIALIZE_SOURCE, TXN_APP_ID, ConsumerContext
from lakeprop.spec import JobKey


class Conf:
    """The three calls of ``spark.conf`` the context makes, over a dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class Session:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.conf = Conf(values or {})


def context(
    session: Session,
    small: bool = False,
    generation: int = 0,
    held: Callable[[Sequence[str]], Any] | None = None,
) -> ConsumerContext:
    return ConsumerContext(
        spark=session,  # type: ignore[arg-type]
        key=JobKey(1, "shop", "orders", "copy"),
        job_id=7,
        consumer_type="replica",
        options={"primary_key": ["id"]},
        source_columns=("id",),
        locate=lambda d, t: None,  # type: ignore[arg-type, return-value]
        cancelled=lambda: False,
        generation=generation,
        small=small,
        held_latest=held,
    )


def test_a_new_generation_writes_under_a_new_delta_transaction_id() -> None:
    """Else Delta would skip the resync's snapshot as a write already done."""
    digest = hashlib.sha256(b'["replica", {"primary_key": ["id"]}]').hexdigest()[:12]
    assert context(Session()).txn_app_id == f"lakeprop-7-{digest}"  # as before generations
    assert len({context(Session(), generation=g).txn_app_id for g in (0, 1, 2)}) == 3


def test_a_small_iterations_merge_skips_the_source_copy_and_the_conf_comes_back() -> None:
    session = Session()
    seen: list[dict[str, Any]] = []
    with context(session, small=True).merging_changes():
        seen.append(dict(session.conf.values))
    assert seen == [{MERGE_MATERIALIZE_SOURCE: "none"}]
    assert session.conf.values == {}

    configured = Session({MERGE_MATERIALIZE_SOURCE: "all"})  # whatever the operator chose
    with context(configured, small=True).merging_changes():
        assert configured.conf.values == {MERGE_MATERIALIZE_SOURCE: "none"}
    assert configured.conf.values == {MERGE_MATERIALIZE_SOURCE: "all"}


def test_a_large_iterations_merge_keeps_deltas_copy() -> None:
    session = Session({MERGE_MATERIALIZE_SOURCE: "auto"})
    ctx = context(session, small=False)
    with ctx.idempotent(3), ctx.merging_changes():
        assert session.conf.values[MERGE_MATERIALIZE_SOURCE] == "auto"
        assert session.conf.values[TXN_APP_ID] == ctx.txn_app_id
    assert session.conf.values == {MERGE_MATERIALIZE_SOURCE: "auto"}


def test_a_large_iterations_merge_reads_the_engines_held_changes_without_a_copy() -> None:
    asked: list[Sequence[str]] = []

    def held(key: Sequence[str]) -> str:
        asked.append(key)
        return "the held rows"

    session = Session({MERGE_MATERIALIZE_SOURCE: "auto"})
    ctx = context(session, small=False, held=held)
    assert ctx.latest_changes(None, ["id"]) == "the held rows"  # type: ignore[arg-type]
    assert asked == [["id"]]
    with ctx.merging_changes():  # the held rows are fixed: Delta need not copy them
        assert session.conf.values[MERGE_MATERIALIZE_SOURCE] == "none"
    assert session.conf.values == {MERGE_MATERIALIZE_SOURCE: "auto"}


def test_the_conf_comes_back_when_the_merge_fails() -> None:
    session = Session()
    try:
        with context(session, small=True).merging_changes():
            raise RuntimeError("the MERGE failed")
    except RuntimeError:
        pass
    assert session.conf.values == {}
