"""Command line: run the service, manage jobs, inspect state, run the local broker.

    lakeprop run --config conf/local.toml
    lakeprop register --database sales --table orders --name copy \\
        --consumer replica --options '{"primary_key": ["id"]}' --trigger greedy
    lakeprop update-spec --database sales --table orders --name copy --priority 5
    lakeprop status --database sales --table orders --name copy
    lakeprop wait --database sales --table orders --name copy --version latest
    lakeprop list --state error
    lakeprop usage --account 7 --since 2026-11-01
    lakeprop accounts
    lakeprop notify --database sales --table orders --version 42
    lakeprop search --database kb --table articles --name text "delta merge" --limit 5
    lakeprop vector-search --database kb --table articles --name vec --vector "[0.1, 0.7]" -k 5
    lakeprop hybrid-search --database kb --table articles --text-job text --vector-job vec \\
        "delta merge" --vector "[0.1, 0.7]"
    lakeprop unregister --database sales --table orders --name copy
    lakeprop bulk pause --account 7 --database sales --job 'copy_*' --wait
    lakeprop bulk status b-1a2b3c
    lakeprop bulk rollback b-1a2b3c --account 7 --wait
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from lakeprop.config import LOCAL_BOOTSTRAP, AppConfig, load_config
from lakeprop.errors import InvalidArgumentError, LakepropError
from lakeprop.spec import JobKey
from lakeprop.state.status import JobState

log = logging.getLogger("lakeprop")


def _config(args: argparse.Namespace) -> AppConfig:
    malformed = [item for item in args.set if "=" not in item]
    if malformed:
        raise InvalidArgumentError(f"--set expects KEY=VALUE, got {malformed[0]!r}")
    overrides = dict(item.split("=", 1) for item in args.set)
    return load_config(args.config or os.environ.get("LAKEPROP_CONFIG"), overrides)


def _json_argument(text: str, flag: str) -> Any:
    """JSON given on the command line, or ``@file`` to read it from a file."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidArgumentError(f"{flag}: cannot read {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"{flag} is not valid JSON: {exc}") from None


def _key(args: argparse.Namespace) -> JobKey:
    return JobKey(args.account, args.database, args.table, args.name)


def _spec_from_flags(args: argparse.Namespace, *, partial: bool) -> dict[str, Any]:  # noqa: C901 - one branch per flag, read top to bottom
    if args.spec:
        whole = _json_argument(args.spec, "--spec")
        if not isinstance(whole, dict):
            raise InvalidArgumentError("--spec must be a JSON object")
        return whole
    trigger: dict[str, Any] = {}
    if args.trigger:
        trigger["kind"] = args.trigger
    if args.interval:
        trigger["interval"] = args.interval
    if args.share:
        trigger["share"] = True
    consumer: dict[str, Any] = {}
    if args.consumer:
        consumer["type"] = args.consumer
    if args.options:
        consumer["options"] = _json_argument(args.options, "--options")
    iteration: dict[str, Any] = {}
    if args.priority is not None:
        iteration["priority"] = args.priority
    if consumer:
        iteration["consumer"] = consumer
    spec = {}
    if trigger or not partial:
        spec["trigger"] = trigger
    if iteration or not partial:
        spec["iteration"] = iteration
    return spec


def _on_stderr(message: str) -> None:
    """Progress of a long wait: on stderr, so stdout keeps only the result."""
    print(message, file=sys.stderr, flush=True)


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def cmd_run(args: argparse.Namespace) -> int:
    from lakeprop import faults
    from lakeprop.service.app import PropagationApp
    from lakeprop.session import build_session

    config = _config(args)
    faults.arm_from_env()
    broker = _maybe_start_broker(config)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, stopping after the current micro-batch", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        spark = build_session(config.spark)
        log.info(
            "lakeprop from %s, Spark %s, master %s, Python %s",
            Path(__file__).parents[1],
            spark.version,
            spark.sparkContext.master,
            sys.executable,
        )
        faults.await_gate()
        PropagationApp(spark, config).run_until(stop)
        log.info("stopped cleanly")
    finally:
        if broker is not None:
            log.info("stopping the local Kafka broker")
            broker.stop()
    return 0


def _maybe_start_broker(config: AppConfig) -> Any:
    """Start the embedded broker for local runs; None if not ours to start."""
    if not config.local_broker.enabled or config.kafka.bootstrap_servers != LOCAL_BOOTSTRAP:
        return None
    from lakeprop.dev.localkafka import LocalKafka

    port = int(LOCAL_BOOTSTRAP.rsplit(":", 1)[1])
    broker = LocalKafka(config.local_broker.data_dir, port=port)
    if broker.running_pid() is not None:
        log.info("reusing the local Kafka broker already running on %s", LOCAL_BOOTSTRAP)
        return None
    log.info("starting the local Kafka broker on %s", LOCAL_BOOTSTRAP)
    return broker.start()


def _session(config: AppConfig) -> Any:
    """A session for a CLI verb (:func:`~lakeprop.session.client_spark_config`): local,
    quiet, so stdout holds only the command's result."""
    from lakeprop.session import build_session, client_spark_config

    spark = build_session(client_spark_config(config.spark))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _client(args: argparse.Namespace, *, with_spark: bool = False) -> Any:
    from lakeprop.client.api import LakepropClient

    config = _config(args)
    spark = _session(config) if with_spark else None
    return LakepropClient(
        config.kafka, config.state, spark, tables=config.tables, notifications=config.notifications
    )


def _reader(args: argparse.Namespace) -> Any:
    """The state reader of a read verb: without Spark (delta-rs) where the service's
    tables resolve by path and the ``native`` extra is installed, else the Spark
    client (metastore tables need the session catalog to find sources)."""
    from lakeprop.consumers import native

    config = _config(args)
    if config.tables.resolution == "path" and native.available():
        from lakeprop.client.lakereads import LakeStateReader

        return LakeStateReader(config.state, config.engine.native_storage_options, config.tables)
    return _client(args, with_spark=True)


_PLAIN_OPS: dict[str, Callable[[Any, JobKey], Any]] = {
    "unregister": lambda client, key: client.unregister_job(key),
    "pause": lambda client, key: client.pause_job(key),
    "resume": lambda client, key: client.resume_job(key),
    "resync": lambda client, key: client.resync_job(key),
}
"""Verbs that name a job and nothing else."""


def _send(args: argparse.Namespace, action: str) -> int:
    client = _client(args, with_spark=args.wait)
    key = _key(args)
    if action == "register":
        receipt = client.register_job(key, _spec_from_flags(args, partial=False))
    elif action in _PLAIN_OPS:
        receipt = _PLAIN_OPS[action](client, key)
    else:
        receipt = client.update_job_spec(
            key, _spec_from_flags(args, partial=True), interrupt=args.interrupt
        )
    client.close()
    _print(asdict(receipt))
    if args.wait:
        outcome = client.wait_for_outcome(receipt, timeout=args.wait_timeout, progress=_on_stderr)
        _print(outcome)
        return 0 if outcome["outcome"] in ("applied",) else 1
    return 0


def _bulk_progress(status: Any) -> None:
    _on_stderr(status.summary())


def _wait_bulk(client: Any, receipt: Any, args: argparse.Namespace) -> int:
    """Wait for the verdict on a bulk message, then for the operation to end, showing
    its progress; 0 when it ended as asked."""
    outcome = client.wait_for_outcome(receipt, timeout=args.wait_timeout, progress=_on_stderr)
    if outcome["outcome"] != "applied":
        _print(outcome)
        return 1
    bulk_id = args.bulk_id if args.action in ("cancel", "rollback") else receipt.request_id
    status = client.wait_for_bulk(
        bulk_id,
        timeout=args.wait_timeout,
        progress=_bulk_progress,
        rollback=args.action == "rollback",
    )
    from lakeprop.client.render import bulk_table

    print(bulk_table(status))
    return 0 if status.operation.state.value in ("success", "cancel", "rollback_success") else 1


def cmd_bulk(args: argparse.Namespace) -> int:
    """``bulk OP`` (pause, resume, resync, update-spec, unregister) with a selector,
    ``bulk cancel|rollback ID``, ``bulk status ID``."""
    if args.action == "status":
        from lakeprop.client.render import bulk_table

        status = _reader(args).bulk_status(args.bulk_id)
        if status is None:
            print(f"no bulk operation {args.bulk_id}", file=sys.stderr)
            return 1
        if args.json:
            tasks = [asdict(t) for t in status.tasks]
            _print({"operation": asdict(status.operation), "tasks": tasks})
        else:
            print(bulk_table(status))
        return 0
    client = _client(args, with_spark=getattr(args, "wait", False))
    if args.action == "cancel":
        receipt = client.cancel_bulk(args.account, args.bulk_id)
    elif args.action == "rollback":
        receipt = client.rollback_bulk(args.account, args.bulk_id)
    else:
        jobs = [tuple(_qualified_job(j)) for j in args.jobs or []] or None
        receipt = client.bulk(
            args.account,
            args.action.replace("-", "_"),
            database=args.database,
            table=args.table,
            job_name=args.job,
            consumer_type=args.consumer_type,
            job_state=args.state,
            jobs=jobs,
            spec=_spec_from_flags(args, partial=True) if args.action == "update-spec" else None,
            interrupt=args.interrupt if args.action == "update-spec" else None,
            bulk_id=args.id,
        )
    client.close()
    _print(asdict(receipt))
    return _wait_bulk(client, receipt, args) if args.wait else 0


def _qualified_job(text: str) -> list[str]:
    parts = text.split(".")
    if len(parts) != 3:
        raise InvalidArgumentError(f"--jobs takes database.table.name, got {text!r}")
    return parts


def _show_jobs(client: Any, jobs: Sequence[Any]) -> None:
    """Jobs as a table, with each source's lag looked up once."""
    from lakeprop.client.render import job_table

    latest: dict[tuple[str, str], int | None] = {}
    for name in {(j.key.database, j.key.table) for j in jobs if j.drop_at is None}:
        try:
            latest[name] = client.source_version(*name)
        except LakepropError:
            latest[name] = None  # a dropped source: the job's error says so
    print(job_table(jobs, latest))


def cmd_status(args: argparse.Namespace) -> int:
    client = _reader(args)
    info = client.get_job_status(_key(args))
    if info is None:
        print(f"no job {_key(args)}", file=sys.stderr)
        return 1
    if args.json:
        _print(asdict(info))
    else:
        _show_jobs(client, [info])
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    info = _client(args, with_spark=True).wait_for_watermark(
        _key(args), args.version, timeout=args.timeout, progress=_on_stderr
    )
    _print(asdict(info))
    return 0


def _version(text: str) -> int | str:
    """A Delta version (>= 0) or 'latest'."""
    if text == "latest":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a version (0, 1, ...) or 'latest': {text!r}")
    return int(text)


def cmd_list(args: argparse.Namespace) -> int:
    client = _reader(args)
    jobs = client.list_jobs(state=args.state, account_id=args.account, include_dropped=args.all)
    if args.json:
        for job in jobs:
            print(json.dumps(asdict(job), sort_keys=True, default=str))
    elif jobs:
        _show_jobs(client, jobs)
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    from lakeprop.client.render import usage_table

    rows = _reader(args).usage(account_id=args.account, since=args.since)
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row), sort_keys=True, default=str))
    elif rows:
        print(usage_table(rows))
    return 0


def cmd_accounts(args: argparse.Namespace) -> int:
    from lakeprop.client.render import accounts_table

    rows = _reader(args).accounts()
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row), sort_keys=True, default=str))
    elif rows:
        print(f"as of {max(r.updated_at for r in rows):%Y-%m-%d %H:%M:%S}")
        print(accounts_table(rows))
    return 0


def cmd_members(args: argparse.Namespace) -> int:
    """The instances sharing the tables (``cluster.enabled``): the group coordinator's
    view, with what each instance last published about itself."""
    import time

    from lakeprop.client.render import members_table
    from lakeprop.membership.members import members

    config = _config(args)
    jobs = _reader(args).list_jobs()
    tables = sorted({(j.key.database, j.key.table) for j in jobs})
    found = members(config.kafka, config.cluster, tables)
    if args.json:
        for member in found:
            print(json.dumps(asdict(member), sort_keys=True, default=str))
    elif found:
        print(members_table(found, time.time()))
    else:
        print(f"no instance in the group of {config.cluster.members_topic(config.kafka.topic)}")
    return 0


def _moment(text: str) -> datetime:
    """An ISO date or date and time (UTC)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date or time such as 2026-11-01 or 2026-11-01T09:00: {text!r}"
        ) from None


def cmd_notify(args: argparse.Namespace) -> int:
    client = _client(args, with_spark=args.version is None)
    version = client.notify_commit(args.database, args.table, args.version)
    client.close()
    _print({"database": args.database, "table": args.table, "version": version})
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from lakeprop.client.search import search

    hits = search(_config(args), _key(args), args.query, limit=args.limit, fields=args.field)
    for hit in hits:
        print(json.dumps({"score": round(hit.score, 6), "key": hit.key}, default=str))
    return 0


def _query_vector(text: str) -> list[float]:
    value = _json_argument(text, "--vector")
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value
    ):
        raise InvalidArgumentError("--vector must be a JSON array of numbers")
    return [float(x) for x in value]


def _filter(args: argparse.Namespace) -> Any:
    value = _json_argument(args.filter, "--filter") if args.filter else None
    if value is not None and not isinstance(value, dict):
        raise InvalidArgumentError("--filter must be a JSON object")
    return value


def cmd_vector_search(args: argparse.Namespace) -> int:
    from lakeprop.client.vectors import VectorSearch

    searcher = VectorSearch.for_job(_config(args), _key(args))
    hits = searcher.search(
        _query_vector(args.vector), k=args.k, nprobe=args.nprobe, filter=_filter(args)
    )
    for hit in hits:
        line = {"distance": round(hit.distance, 6), "key": hit.key, "columns": hit.columns}
        print(json.dumps(line, default=str))
    return 0


def cmd_hybrid_search(args: argparse.Namespace) -> int:
    from lakeprop.client.vectors import hybrid_search

    hits = hybrid_search(
        _config(args),
        JobKey(args.account, args.database, args.table, args.text_job),
        JobKey(args.account, args.database, args.table, args.vector_job),
        args.query,
        _query_vector(args.vector),
        k=args.k,
        nprobe=args.nprobe,
        filter=_filter(args),
    )
    for hit in hits:
        line = {
            "score": round(hit.score, 6),
            "key": hit.key,
            "text_rank": hit.text_rank,
            "vector_rank": hit.vector_rank,
        }
        print(json.dumps(line, default=str))
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    from lakeprop.dev.localkafka import LocalKafka

    config = _config(args)
    port = int(LOCAL_BOOTSTRAP.rsplit(":", 1)[1])
    broker = LocalKafka(args.data_dir or config.local_broker.data_dir, port=args.port or port)
    if args.action == "start":
        if broker.running_pid() is None:
            broker.start()
        print(broker.bootstrap_servers)
    elif args.action == "stop":
        broker.stop()
    else:
        pid = broker.running_pid()
        print(f"running (pid {pid}) on {broker.bootstrap_servers}" if pid else "not running")
        return 0 if pid else 1
    return 0


def _add_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--account", type=int, default=0, help="tenant account id (default 0)")
    p.add_argument("--database", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--name", required=True, help="job name")


def _add_searches(sub: Any) -> None:
    p = sub.add_parser("search", help="rank documents of a fulltext_index job with BM25")
    _add_key(p)
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--field", action="append", help="search only this indexed column (repeatable)")
    p = sub.add_parser("vector-search", help="the k nearest rows of a vector_index job")
    _add_key(p)
    _add_vector_query(p)
    p = sub.add_parser(
        "hybrid-search",
        help="BM25 and k-NN over two jobs of one table, fused by reciprocal rank fusion",
    )
    p.add_argument("--account", type=int, default=0, help="tenant account id (default 0)")
    p.add_argument("--database", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--text-job", required=True, help="the fulltext_index job's name")
    p.add_argument("--vector-job", required=True, help="the vector_index job's name")
    p.add_argument("query", help="the text query")
    _add_vector_query(p)


def _add_vector_query(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vector", required=True, help="the query vector: a JSON array, or @file")
    p.add_argument("-k", type=int, default=10, help="how many results (default 10)")
    p.add_argument("--nprobe", type=int, help="lists to probe (default: the index's)")
    p.add_argument("--filter", help='included columns\' conditions, JSON: {"lang": "en"}')


def _add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", help="whole spec as JSON, or @file.json")
    p.add_argument("--trigger", choices=["default", "greedy", "periodic"])
    p.add_argument("--interval", help="periodic interval, e.g. 30s, 5m")
    p.add_argument("--share", action="store_true", help="periodic jobs share iterations")
    p.add_argument("--priority", type=int)
    p.add_argument("--consumer", help="consumer type, e.g. replica")
    p.add_argument("--options", help="consumer options as JSON")


BULK_OPERATIONS = ("pause", "resume", "resync", "update-spec", "unregister")


def _add_bulk(sub: Any) -> None:
    bulk = sub.add_parser("bulk", help="one operation on many jobs, with progress and rollback")
    actions = bulk.add_subparsers(dest="action", required=True)
    for operation in BULK_OPERATIONS:
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
            _add_spec(p)
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


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="lakeprop", description=__doc__.split("\n")[0])
    root.add_argument("--config", help="TOML config (default: $LAKEPROP_CONFIG or built-ins)")
    root.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting"
    )
    root.add_argument("-v", "--verbose", action="store_true")
    root.add_argument(
        "--json",
        action="store_true",
        help="status, list, usage and accounts: JSON instead of a table",
    )
    sub = root.add_subparsers(dest="command", required=True)

    sub.add_parser("run", help="run the streaming service until SIGINT/SIGTERM")
    for action in ("register", "unregister", "update-spec", "pause", "resume", "resync"):
        p = sub.add_parser(action, help=f"{action} a job through the change log")
        _add_key(p)
        if action not in _PLAIN_OPS:
            _add_spec(p)
        if action == "update-spec":
            p.add_argument("--interrupt", action="store_true", help="interrupt a running iteration")
        p.add_argument("--wait", action="store_true", help="wait for the service's verdict")
        p.add_argument("--wait-timeout", type=float, default=120.0)
    p = sub.add_parser("status", help="show one job")
    _add_key(p)
    p = sub.add_parser(
        "wait", help="wait until a job has consumed a source version (0 when reached)"
    )
    _add_key(p)
    p.add_argument(
        "--version",
        type=_version,
        default="latest",
        help="source Delta version, or 'latest': the source's version now (default)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    p = sub.add_parser("list", help="list jobs")
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--account", type=int)
    p.add_argument("--all", action="store_true", help="include dropped jobs")
    p = sub.add_parser("usage", help="what jobs used, per job and hour (charging)")
    p.add_argument("--account", type=int)
    p.add_argument("--since", type=_moment, help="from this hour on (ISO date or time)")
    sub.add_parser(
        "accounts", help="each account's queued and running iterations, waits, backpressure"
    )
    sub.add_parser(
        "members", help="the instances sharing the tables: slots, tables, lag, last heartbeat"
    )
    p = sub.add_parser("notify", help="announce a commit to a source table (notifications)")
    p.add_argument("--database", required=True)
    p.add_argument("--table", required=True)
    p.add_argument(
        "--version", type=int, help="the Delta version committed (default: read the latest)"
    )
    _add_searches(sub)
    _add_bulk(sub)
    p = sub.add_parser("broker", help="the local development Kafka broker")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--data-dir")
    p.add_argument("--port", type=int)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    handlers = {
        "run": cmd_run,
        "register": lambda a: _send(a, "register"),
        "unregister": lambda a: _send(a, "unregister"),
        "update-spec": lambda a: _send(a, "update-spec"),
        "pause": lambda a: _send(a, "pause"),
        "resume": lambda a: _send(a, "resume"),
        "resync": lambda a: _send(a, "resync"),
        "status": cmd_status,
        "wait": cmd_wait,
        "list": cmd_list,
        "usage": cmd_usage,
        "accounts": cmd_accounts,
        "members": cmd_members,
        "notify": cmd_notify,
        "search": cmd_search,
        "vector-search": cmd_vector_search,
        "hybrid-search": cmd_hybrid_search,
        "bulk": cmd_bulk,
        "broker": cmd_broker,
    }
    try:
        return int(handlers[args.command](args))
    except LakepropError as exc:
        print(f"error [{exc.code}]: {exc}", file=sys.stderr)
        return 2 if exc.is_temporary else 1


if __name__ == "__main__":
    sys.exit(main())
