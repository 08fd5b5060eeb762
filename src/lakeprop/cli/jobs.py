"""The job verbs: register, update and drop jobs through the change log, show them,
and wait for them.

    lakeprop register --database sales --table orders --name copy \\
        --consumer replica --options '{"primary_key": ["id"]}' --trigger greedy
    lakeprop update-spec --database sales --table orders --name copy --priority 5
    lakeprop status --database sales --table orders --name copy
    lakeprop wait --database sales --table orders --name copy --version latest
    lakeprop list --state error
    lakeprop graph --database sales --format mermaid
    lakeprop explain --database sales --table orders --name enriched
    lakeprop unregister --database sales --table orders --name copy [--cascade]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lakeprop.cli import common
from lakeprop.errors import InvalidArgumentError, LakepropError
from lakeprop.spec import JobKey
from lakeprop.state.status import JobState

PLAIN: dict[str, Callable[[Any, JobKey, argparse.Namespace], Any]] = {
    "unregister": lambda client, key, args: client.unregister_job(key, cascade=args.cascade),
    "pause": lambda client, key, args: client.pause_job(key),
    "resume": lambda client, key, args: client.resume_job(key),
    "resync": lambda client, key, args: client.resync_job(key),
}
"""Verbs that name a job and no spec."""


def send(args: argparse.Namespace) -> int:
    """One change log message about one job; with ``--wait``, its verdict too."""
    client = common.client(args, with_spark=args.wait)
    key = common.key(args)
    if args.command == "register":
        receipt = client.register_job(key, common.spec_from_flags(args, partial=False))
    elif args.command in PLAIN:
        receipt = PLAIN[args.command](client, key, args)
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
        return 0
    show_jobs(client, [info])
    if info.freshness is not None:
        fresh = info.freshness
        print(
            f"pipeline: its last write, at {fresh['at']:%Y-%m-%d %H:%M:%S}, was "
            f"{fresh['seconds']:.2f} s behind the commit to {fresh['origin']} it reflects"
        )
    return 0


def wait(args: argparse.Namespace) -> int:
    if args.origin is not None and args.version is not None:
        raise InvalidArgumentError("--origin names its own version: leave --version out")
    client = common.client(args, with_spark=True)
    if args.origin is None:
        at = "latest" if args.version is None else args.version
        info = client.wait_for_watermark(
            common.key(args), at, timeout=args.timeout, progress=common.on_stderr
        )
    else:
        (database, table), at = args.origin
        info = client.wait_for_origin(
            common.key(args),
            (database, table),
            at,
            timeout=args.timeout,
            progress=common.on_stderr,
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


def graph(args: argparse.Namespace) -> int:
    """The pipeline graph of the live jobs: all, a database's, or one job's chains."""
    from lakeprop.pipeline import render
    from lakeprop.pipeline.graph import Graph, Node

    if (args.table is None) != (args.name is None) or (args.name and not args.database):
        raise InvalidArgumentError("name one job with --database, --table and --name together")
    jobs = common.reader(args).list_jobs()
    whole = Graph.of(Node.of_spec(job.key, job.spec) for job in jobs)
    one = common.key(args) if args.name else None
    shown = render.selected(whole, None if one else args.database, one)
    label = render.labels([(j.key, j.spec["iteration"]["consumer"]["type"], j.state) for j in jobs])
    drawn = render.FORMATS[args.format](shown, label)
    if args.output:
        Path(args.output).write_text(drawn + "\n")
    else:
        print(drawn)
    return 0


def explain(args: argparse.Namespace) -> int:
    """How a join view is kept: a registered job's, or one proposed by the spec flags."""
    from lakeprop.client.explain import explain_job

    app = common.config(args)
    key = common.key(args)
    registered = None
    if args.spec or args.consumer or args.options:
        spec = common.spec_from_flags(args, partial=False)
    else:
        info = common.reader(args).get_job_status(key, waiting=False)
        if info is None or info.drop_at is not None:
            print(f"no job {key}: name a live job, or give a spec to explain", file=sys.stderr)
            return 1
        spec, registered = info.spec, (info.watermark, info.status)
    for line in explain_job(common.session(app), app.tables, key, spec, registered):
        print(line)
    return 0


def version(text: str) -> int | str:
    """A Delta version (>= 0) or 'latest'."""
    if text == "latest":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a version (0, 1, ...) or 'latest': {text!r}")
    return int(text)


def origin(text: str) -> tuple[tuple[str, str], int | str]:
    """``database.table@version`` (or ``@latest``, or no ``@``: the latest)."""
    name, _, at = text.partition("@")
    database, dot, table = name.partition(".")
    if not dot or not database or not table or "." in table:
        raise argparse.ArgumentTypeError(f"expected database.table@version: {text!r}")
    return (database, table), version(at or "latest")


def register(sub: Any) -> None:
    for action in ("register", "unregister", "update-spec", "pause", "resume", "resync"):
        p = sub.add_parser(action, help=f"{action} a job through the change log")
        common.add_key(p)
        if action not in PLAIN:
            common.add_spec(p)
        if action == "update-spec":
            p.add_argument("--interrupt", action="store_true", help="interrupt a running iteration")
        if action == "unregister":
            p.add_argument(
                "--cascade",
                action="store_true",
                help="drop the jobs that read this job's target too, at any depth",
            )
        common.add_wait(p, 120.0)
        p.set_defaults(handler=send)
    p = sub.add_parser("status", help="show one job")
    common.add_key(p)
    p.set_defaults(handler=status)
    p = sub.add_parser(
        "wait",
        help="wait until a job has consumed a source version, or a commit upstream of it "
        "(0 when reached)",
    )
    common.add_key(p)
    p.add_argument(
        "--version",
        type=version,
        help="source Delta version, or 'latest': the source's version now (the default)",
    )
    p.add_argument(
        "--origin",
        type=origin,
        metavar="DB.TABLE@VERSION",
        help="instead: until this commit to a table upstream of the job has reached it, "
        "through every job between them (VERSION may be 'latest')",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    p.set_defaults(handler=wait)
    p = sub.add_parser("graph", help="the pipeline graph: which jobs read which jobs' targets")
    p.add_argument("--account", type=int, default=0, help="the job's account (with --name)")
    p.add_argument("--database", help="the jobs reading or writing this database's tables")
    p.add_argument("--table", help="with --database and --name: one job's chains")
    p.add_argument("--name", help="the job's name")
    p.add_argument("--format", choices=["text", "mermaid", "dot"], default="text")
    p.add_argument("--output", help="write to this file instead of printing")
    p.set_defaults(handler=graph)
    p = sub.add_parser(
        "explain",
        help="how a join_view job is kept: its sources and their versions, its keys, its "
        "technique and how each source's layout serves it (a registered job, or the spec given)",
    )
    common.add_key(p)
    common.add_spec(p)
    p.set_defaults(handler=explain)
    p = sub.add_parser("list", help="list jobs")
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--account", type=int)
    p.add_argument("--all", action="store_true", help="include dropped jobs")
    p.set_defaults(handler=list_jobs)
