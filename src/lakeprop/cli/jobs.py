"""The job verbs: register, update and drop jobs through the change log, show them,
and wait for them.

    lakeprop register --database sales --table orders --name copy \\
        --consumer replica --options '{"primary_key": ["id"]}' --trigger greedy
    lakeprop update-spec --database sales --table orders --name copy --priority 5
    lakeprop status --database sales --table orders --name copy
    lakeprop wait --database sales --table orders --name copy --version latest
    lakeprop list --state error
    lakeprop unregister --database sales --table orders --name copy
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from lakeprop.cli import common
from lakeprop.errors import LakepropError
from lakeprop.spec import JobKey
from lakeprop.state.status import JobState

PLAIN: dict[str, Callable[[Any, JobKey], Any]] = {
    "unregister": lambda client, key: client.unregister_job(key),
    "pause": lambda client, key: client.pause_job(key),
    "resume": lambda client, key: client.resume_job(key),
    "resync": lambda client, key: client.resync_job(key),
}
"""Verbs that name a job and nothing else."""


def send(args: argparse.Namespace) -> int:
    """One change log message about one job; with ``--wait``, its verdict too."""
    client = common.client(args, with_spark=args.wait)
    key = common.key(args)
    if args.command == "register":
        receipt = client.register_job(key, common.spec_from_flags(args, partial=False))
    elif args.command in PLAIN:
        receipt = PLAIN[args.command](client, key)
    else:
        receipt = client.update_job_spec(
            key, common.spec_from_flags(args, partial=True), interrupt=args.interrupt
        )
    client.close()
    common.print_json(asdict(receipt))
    if args.wait:
        outcome = client.wait_for_outcome(
            receipt, timeout=args.wait_timeout, progress=common.on_stderr
        )
        common.print_json(outcome)
        return 0 if outcome["outcome"] in ("applied",) else 1
    return 0


def show_jobs(client: Any, jobs: Sequence[Any]) -> None:
    """Jobs as a table, with each source's lag looked up once."""
    from lakeprop.client.render import job_table

    latest: dict[tuple[str, str], int | None] = {}
    for name in {(j.key.database, j.key.table) for j in jobs if j.drop_at is None}:
        try:
            latest[name] = client.source_version(*name)
        except LakepropError:
            latest[name] = None  # a dropped source: the job's error says so
    print(job_table(jobs, latest))


def status(args: argparse.Namespace) -> int:
    client = common.reader(args)
    info = client.get_job_status(common.key(args))
    if info is None:
        print(f"no job {common.key(args)}", file=sys.stderr)
        return 1
    if args.json:
        common.print_json(asdict(info))
    else:
        show_jobs(client, [info])
    return 0


def wait(args: argparse.Namespace) -> int:
    info = common.client(args, with_spark=True).wait_for_watermark(
        common.key(args), args.version, timeout=args.timeout, progress=common.on_stderr
    )
    common.print_json(asdict(info))
    return 0


def list_jobs(args: argparse.Namespace) -> int:
    client = common.reader(args)
    jobs = client.list_jobs(state=args.state, account_id=args.account, include_dropped=args.all)
    if args.json:
        common.print_lines(jobs)
    elif jobs:
        show_jobs(client, jobs)
    return 0


def version(text: str) -> int | str:
    """A Delta version (>= 0) or 'latest'."""
    if text == "latest":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a version (0, 1, ...) or 'latest': {text!r}")
    return int(text)


def register(sub: Any) -> None:
    for action in ("register", "unregister", "update-spec", "pause", "resume", "resync"):
        p = sub.add_parser(action, help=f"{action} a job through the change log")
        common.add_key(p)
        if action not in PLAIN:
            common.add_spec(p)
        if action == "update-spec":
            p.add_argument("--interrupt", action="store_true", help="interrupt a running iteration")
        common.add_wait(p, 120.0)
        p.set_defaults(handler=send)
    p = sub.add_parser("status", help="show one job")
    common.add_key(p)
    p.set_defaults(handler=status)
    p = sub.add_parser(
        "wait", help="wait until a job has consumed a source version (0 when reached)"
    )
    common.add_key(p)
    p.add_argument(
        "--version",
        type=version,
        default="latest",
        help="source Delta version, or 'latest': the source's version now (default)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    p.set_defaults(handler=wait)
    p = sub.add_parser("list", help="list jobs")
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--account", type=int)
    p.add_argument("--all", action="store_true", help="include dropped jobs")
    p.set_defaults(handler=list_jobs)
