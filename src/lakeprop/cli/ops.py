"""The operations verbs: run the service, see what it uses and who serves what,
announce commits, and run the local development broker.

    lakeprop run --config conf/local.toml
    lakeprop usage --account 7 --since 2026-11-01
    lakeprop accounts
    lakeprop members
    lakeprop notify --database sales --table orders --version 42
    lakeprop broker start
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lakeprop.cli import common
from lakeprop.config import LOCAL_BOOTSTRAP, AppConfig

log = logging.getLogger("lakeprop")


def run(args: argparse.Namespace) -> int:
    """The service, until SIGINT or SIGTERM (with the embedded broker on local runs)."""
    from lakeprop import faults
    from lakeprop.service.app import PropagationApp
    from lakeprop.session import build_session

    app = common.config(args)
    faults.arm_from_env()
    broker = start_local_broker(app)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, stopping after the current micro-batch", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        spark = build_session(app.spark)
        log.info(
            "lakeprop from %s, Spark %s, master %s, Python %s",
            Path(__file__).parents[1],
            spark.version,
            spark.sparkContext.master,
            sys.executable,
        )
        faults.await_gate()
        PropagationApp(spark, app).run_until(stop)
        log.info("stopped cleanly")
    finally:
        if broker is not None:
            log.info("stopping the local Kafka broker")
            broker.stop()
    return 0


def start_local_broker(app: AppConfig) -> Any:
    """Start the embedded broker for local runs; None if not ours to start."""
    if not app.local_broker.enabled or app.kafka.bootstrap_servers != LOCAL_BOOTSTRAP:
        return None
    from lakeprop.dev.localkafka import LocalKafka

    port = int(LOCAL_BOOTSTRAP.rsplit(":", 1)[1])
    broker = LocalKafka(app.local_broker.data_dir, port=port)
    if broker.running_pid() is not None:
        log.info("reusing the local Kafka broker already running on %s", LOCAL_BOOTSTRAP)
        return None
    log.info("starting the local Kafka broker on %s", LOCAL_BOOTSTRAP)
    return broker.start()


def usage(args: argparse.Namespace) -> int:
    from lakeprop.client.render import usage_table

    rows = common.reader(args).usage(account_id=args.account, since=args.since)
    if args.json:
        common.print_lines(rows)
    elif rows:
        print(usage_table(rows))
    return 0


def accounts(args: argparse.Namespace) -> int:
    from lakeprop.client.render import accounts_table

    rows = common.reader(args).accounts()
    if args.json:
        common.print_lines(rows)
    elif rows:
        print(f"as of {max(r.updated_at for r in rows):%Y-%m-%d %H:%M:%S}")
        print(accounts_table(rows))
    return 0


def members(args: argparse.Namespace) -> int:
    """The instances sharing the tables (``cluster.enabled``): the group coordinator's
    view, with what each instance last published about itself."""
    from lakeprop.client.render import members_table
    from lakeprop.membership.members import members as group_members

    app = common.config(args)
    jobs = common.reader(args).list_jobs()
    tables = sorted({(j.key.database, j.key.table) for j in jobs})
    found = group_members(app.kafka, app.cluster, tables)
    if args.json:
        common.print_lines(found)
    elif found:
        print(members_table(found, time.time()))
    else:
        print(f"no instance in the group of {app.cluster.members_topic(app.kafka.topic)}")
    return 0


def notify(args: argparse.Namespace) -> int:
    client = common.client(args, with_spark=args.version is None)
    version = client.notify_commit(args.database, args.table, args.version)
    client.close()
    common.print_json({"database": args.database, "table": args.table, "version": version})
    return 0


def broker(args: argparse.Namespace) -> int:
    from lakeprop.dev.localkafka import LocalKafka

    app = common.config(args)
    port = int(LOCAL_BOOTSTRAP.rsplit(":", 1)[1])
    local = LocalKafka(args.data_dir or app.local_broker.data_dir, port=args.port or port)
    if args.action == "start":
        if local.running_pid() is None:
            local.start()
        print(local.bootstrap_servers)
    elif args.action == "stop":
        local.stop()
    else:
        pid = local.running_pid()
        print(f"running (pid {pid}) on {local.bootstrap_servers}" if pid else "not running")
        return 0 if pid else 1
    return 0


def register_run(sub: Any) -> None:
    sub.add_parser("run", help="run the streaming service until SIGINT/SIGTERM").set_defaults(
        handler=run
    )


def register(sub: Any) -> None:
    p = sub.add_parser("usage", help="what jobs used, per job and hour (charging)")
    p.add_argument("--account", type=int)
    p.add_argument("--since", type=common.moment, help="from this hour on (ISO date or time)")
    p.set_defaults(handler=usage)
    sub.add_parser(
        "accounts", help="each account's queued and running iterations, waits, backpressure"
    ).set_defaults(handler=accounts)
    sub.add_parser(
        "members", help="the instances sharing the tables: slots, tables, lag, last heartbeat"
    ).set_defaults(handler=members)
    p = sub.add_parser("notify", help="announce a commit to a source table (notifications)")
    p.add_argument("--database", required=True)
    p.add_argument("--table", required=True)
    p.add_argument(
        "--version", type=int, help="the Delta version committed (default: read the latest)"
    )
    p.set_defaults(handler=notify)


def register_broker(sub: Any) -> None:
    p = sub.add_parser("broker", help="the local development Kafka broker")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--data-dir")
    p.add_argument("--port", type=int)
    p.set_defaults(handler=broker)
