"""The CLI's text output, its answers to malformed input and its quiet Kafka client."""

from __future__ import annotations

import logging
from datetime import datetime

import pytest

from lakeprop import cli
from lakeprop.client.api import JobInfo, Progress, Repeats
from lakeprop.client.render import job_table
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey

KEY = ["--database", "shop", "--table", "items", "--name", "copy"]


def job(name: str, state: str, watermark: int | None, **status: object) -> JobInfo:
    return JobInfo(
        key=JobKey(1, "shop", "items", name),
        job_id=len(name),
        table_id="tid",
        state=state,
        watermark=watermark,
        spec={},
        status=dict(status),
        create_at=datetime(2026, 1, 1),
        drop_at=None,
    )


def test_the_job_table_shows_state_watermark_lag_and_the_last_error_in_one_line() -> None:
    jobs = [
        job("copy", "completed", 7),
        job("idx", "error", 3, error_code=10202, error_msg="source shop.items was\nreplaced " * 9),
        job("new", "pending", None),
        job("join", "completed", 8, joined={"shop.prices": {"version": 3, "table_id": "t"}}),
    ]
    assert job_table(jobs, {("shop", "items"): 9}).splitlines() == [
        "JOB                ID  STATE      WATERMARK         LAG  LAST ERROR",
        "1/shop.items/copy  4   completed  7                 2",
        "1/shop.items/idx   3   error      3                 6    "
        "[10202] source shop.items was replaced source shop.items wa…",
        "1/shop.items/new   3   pending    -                 -",
        "1/shop.items/join  4   completed  8 +shop.prices@3  1",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["register", *KEY, "--options", "{bad"], "--options is not valid JSON"),
        (["register", *KEY, "--spec", "@/no/such/spec.json"], "--spec: cannot read"),
        (["register", *KEY, "--spec", "[1, 2]"], "--spec must be a JSON object"),
        (["--set", "kafka.topic", "status", *KEY], "--set expects KEY=VALUE"),
        (["--config", "/no/such.toml", "status", *KEY], "config file /no/such.toml does not"),
    ],
)
def test_malformed_input_gets_one_clear_line_and_no_traceback(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error [1000") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert f"[{int(ErrorCode.INVALID_ARGUMENT)}]" in err or "config file" in err


def test_a_repeated_kafka_client_line_passes_once_a_minute() -> None:
    now = [0.0]
    repeats = Repeats(60.0, clock=lambda: now[0])

    def passes(message: str) -> bool:
        return repeats.filter(logging.LogRecord("k", logging.ERROR, "", 0, message, None, None))

    refused = "127.0.0.1:{}/bootstrap: Connect failed: Connection refused (after {}ms)"
    assert passes(refused.format(19092, 0))
    assert not passes(refused.format(19092, 3))  # the same line, other timings
    assert passes("Disconnected while requesting ApiVersion")  # another line
    now[0] = 61.0
    assert passes(refused.format(19092, 7))


def test_a_long_wait_reports_every_few_seconds_and_a_short_one_never() -> None:
    now = [100.0]
    heard: list[str] = []
    tell = Progress(heard.append, every=5.0, clock=lambda: now[0])
    for t in (100.0, 103.0, 105.0, 107.0, 110.5, 111.0):
        now[0] = t
        tell("waiting for job j")
    assert heard == ["waiting for job j (5s)", "waiting for job j (10s)"]
    Progress(None)("nobody listens")  # no reporter: nothing happens
