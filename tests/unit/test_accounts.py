"""The published account loads: rows of the scheduler's loads, and the CLI table (no Spark)."""

from __future__ import annotations

from datetime import datetime

from lakeprop.client.render import accounts_table
from lakeprop.engine.housekeeping import account_rows
from lakeprop.engine.scheduler import AccountLoad
from lakeprop.state.accounts import AccountRow

NOW = datetime(2026, 11, 24, 12, 0, 30).timestamp()


def test_loads_become_one_row_per_account_with_moments() -> None:
    loads = {
        7: AccountLoad(
            queued=3,
            running=2,
            cached_rows=900,
            paused_since=NOW - 20.0,
            waiting_since=NOW - 25.0,
            cached_bytes=36_000,
        ),
        2: AccountLoad(queued=0, running=1, cached_rows=10, paused_since=None),
    }
    at = datetime.fromtimestamp(NOW)
    assert account_rows(loads, NOW) == [
        AccountRow(2, 0, 1, 10, 0, None, None, at),
        AccountRow(
            7,
            3,
            2,
            900,
            36_000,
            datetime(2026, 11, 24, 12, 0, 10),
            datetime(2026, 11, 24, 12, 0, 5),
            at,
        ),
    ]


def test_the_cli_table_says_how_long_each_account_has_waited_and_been_paused() -> None:
    assert accounts_table(
        account_rows(
            {
                7: AccountLoad(3, 2, 900, NOW - 20.0, NOW - 25.5, 2_500_000),
                2: AccountLoad(0, 1, 10, None),
            },
            NOW,
        )
    ).splitlines() == [
        "ACCOUNT  QUEUED  RUNNING  ROWS IN FLIGHT  MB IN FLIGHT  WAITING                 PAUSED",
        "2        0       1        10              0.00          -                       -",
        "7        3       2        900             2.50          25.5s (since 12:00:04)  "
        "20.0s (since 12:00:10)",
    ]
