"""The ``bulk`` verb: one operation on many jobs, with progress, cancel and rollback.

lakeprop bulk pause --account 7 --database sales --job 'copy_*' --wait
lakeprop bulk status b-1a2b3c
lakeprop bulk rollback b-1a2b3c --account 7 --wait
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import Any

from lakeprop.cli import common
from lakeprop.errors import InvalidArgumentError
from lakeprop.state.status import JobState

OPERATIONS = ("pause", "resume", "resync", "update-spec", "unregister")


def bulk(args: argparse.Namespace) -> int:
    """``bulk OP`` (pause, resume, resync, update-spec, unregister) with a selector,
    ``bulk cancel|rollback ID``, ``bulk status ID``."""
    if args.action == "status":
        return show(args)
    client = common.client(args, with_spark=getattr(args, "wait", False))
    if args.action == "cancel":
        receipt = client.cancel_bulk(args.account, args.bulk_id)
    elif args.action == "rollback":
        receipt = client.rollback_bulk(args.account, args.bulk_id)
    else:
        jobs = [tuple(qualified_job(j)) for j in args.jobs or []] or None
        receipt = client.bulk(
            args.account,
            args.action.replace("-", "_"),
            database=args.database,
            table=args.table,
            job_name=args.job,
            consumer_type=args.consumer_type,
            job_state=args.state,
            jobs=jobs,
            spec=(
                common.spec_from_flags(args, partial=True) if args.action == "update-spec" else None
            ),
            interrupt=args.interrupt if args.action == "update-spec" else None,
            bulk_id=args.id,
        )
    client.close()
    common.print_json(asdict(receipt))
    return wait(client, receipt, args) if args.wait else 0


def show(args: argparse.Namespace) -> int:
    from lakeprop.client.render import bulk_table

    status = common.reader(args).bulk_status(args.bulk_id)
    if status is None:
        print(f"no bulk operation {args.bulk_id}", file=sys.stderr)
        return 1
    if args.json:
        tasks = [asdict(t) for t in status.tasks]
        common.print_json({"operation": asdict(status.operation), "tasks": tasks})
    else:
        print(bulk_table(status))
    return 0


def wait(client: Any, receipt: Any, args: argparse.Namespace) -> int:
    """Wait for the verdict on a bulk message, then for the operation to end, showing
    its progress; 0 when it ended as asked."""
    outcome = client.wait_for_outcome(receipt, timeout=args.wait_timeout, progress=common.on_stderr)
    if outcome["outcome"] != "applied":
        common.print_json(outcome)
        return 1
    bulk_id = args.bulk_id if args.action in ("cancel", "rollback") else receipt.request_id
    status = client.wait_for_bulk(
        bulk_id,
        timeout=args.wait_timeout,
        progress=lambda s: common.on_stderr(s.summary()),
        rollback=args.action == "rollback",
    )
    from lakeprop.client.render import bulk_table

    print(bulk_table(status))
    return 0 if status.operation.state.value in ("success", "cancel", "rollback_success") else 1


def qualified_job(text: str) -> list[str]:
    parts = text.split(".")
    if len(parts) != 3:
        raise InvalidArgumentError(f"--jobs takes database.table.name, got {text!r}")
    return parts


def register(sub: Any) -> None:
    parser = sub.add_parser("bulk", help="one operation on many jobs, with progress and rollback")
    parser.set_defaults(handler=bulk)
    actions = parser.add_subparsers(dest="action", required=True)
    for operation in OPERATIONS:
        p = actions.add_parser(operation, help=f"{operation} every job the selector matches")
        p.add_argument("--account", type=int, required=True, help="the jobs' account id")
        p.add_argument("--database", help="database name or glob pattern")
        p.add_argument("--table", help="table name or glob pattern")
        p.add_argument("--job", help="job name or glob pattern, e.g. 'copy_*'")
        p.add_argument("--consumer-type", help="only jobs with this consumer type")
        p.add_argument("--state", choices=[s.value for s in JobState])
        p.add_argument("--jobs", nargs="+", metavar="DB.TABLE.NAME", help="an explicit list")
        p.add_argument("--id", help="the bulk operation's id (default: a new one)")
        if operation == "update-spec":
            common.add_spec(p)
            p.add_argument("--interrupt", action="store_true", help="interrupt running iterations")
    for action in ("cancel", "rollback"):
        p = actions.add_parser(action, help=f"{action} a bulk operation")
        p.add_argument("bulk_id")
        p.add_argument("--account", type=int, required=True, help="the operation's account id")
    for p in actions.choices.values():
        p.add_argument("--wait", action="store_true", help="wait, showing progress, until it ends")
        p.add_argument("--wait-timeout", type=float, default=600.0)
    p = actions.add_parser("status", help="a bulk operation and each task's result")
    p.add_argument("bulk_id")
