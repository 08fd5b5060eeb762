"""What every verb of the command line shares: the configuration, the client, the
state reader, a quiet Spark session, and the flags that name a job or a spec."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from lakeprop.config import AppConfig, load_config
from lakeprop.errors import InvalidArgumentError
from lakeprop.spec import JobKey


def config(args: argparse.Namespace) -> AppConfig:
    """The configuration of ``--config`` (or ``$LAKEPROP_CONFIG``) with ``--set`` over it."""
    malformed = [item for item in args.set if "=" not in item]
    if malformed:
        raise InvalidArgumentError(f"--set expects KEY=VALUE, got {malformed[0]!r}")
    overrides = dict(item.split("=", 1) for item in args.set)
    return load_config(args.config or os.environ.get("LAKEPROP_CONFIG"), overrides)


def json_argument(text: str, flag: str) -> Any:
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


def key(args: argparse.Namespace) -> JobKey:
    return JobKey(args.account, args.database, args.table, args.name)


def add_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--account", type=int, default=0, help="tenant account id (default 0)")
    p.add_argument("--database", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--name", required=True, help="job name")


def add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", help="whole spec as JSON, or @file.json")
    p.add_argument("--trigger", choices=["default", "greedy", "periodic"])
    p.add_argument("--interval", help="periodic interval, e.g. 30s, 5m")
    p.add_argument("--share", action="store_true", help="periodic jobs share iterations")
    p.add_argument("--priority", type=int)
    p.add_argument("--consumer", help="consumer type, e.g. replica")
    p.add_argument("--options", help="consumer options as JSON")


def spec_from_flags(args: argparse.Namespace, *, partial: bool) -> dict[str, Any]:  # noqa: C901 - one branch per flag, read top to bottom
    """The spec the flags of :func:`add_spec` give: whole, or only what they name."""
    if args.spec:
        whole = json_argument(args.spec, "--spec")
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
        consumer["options"] = json_argument(args.options, "--options")
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


def add_wait(p: argparse.ArgumentParser, timeout: float) -> None:
    p.add_argument("--wait", action="store_true", help="wait for the service's verdict")
    p.add_argument("--wait-timeout", type=float, default=timeout)


def moment(text: str) -> datetime:
    """An ISO date or date and time (UTC)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date or time such as 2026-11-01 or 2026-11-01T09:00: {text!r}"
        ) from None


def on_stderr(message: str) -> None:
    """Progress of a long wait: on stderr, so stdout keeps only the result."""
    print(message, file=sys.stderr, flush=True)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def print_lines(rows: Any) -> None:
    """Dataclass rows as one JSON object a line."""
    from dataclasses import asdict

    for row in rows:
        print(json.dumps(asdict(row), sort_keys=True, default=str))


def session(app: AppConfig) -> Any:
    """A session for a CLI verb (:func:`~lakeprop.session.client_spark_config`): local,
    quiet, so stdout holds only the command's result."""
    from lakeprop.session import build_session, client_spark_config

    spark = build_session(client_spark_config(app.spark))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def client(args: argparse.Namespace, *, with_spark: bool = False) -> Any:
    """The client of the configured service; with ``with_spark``, able to wait."""
    from lakeprop.client.api import LakepropClient

    app = config(args)
    spark = session(app) if with_spark else None
    return LakepropClient(
        app.kafka, app.state, spark, tables=app.tables, notifications=app.notifications
    )


def reader(args: argparse.Namespace) -> Any:
    """The state reader of a read verb: without Spark (delta-rs) where the service's
    tables resolve by path and the ``native`` extra is installed, else the Spark
    client (metastore tables need the session catalog to find sources)."""
    from lakeprop.consumers import native

    app = config(args)
    if app.tables.resolution == "path" and native.available():
        from lakeprop.client.reads import StateReader

        return StateReader.without_spark(app)
    return client(args, with_spark=True)
