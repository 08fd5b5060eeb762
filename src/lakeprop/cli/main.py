"""Command line: run the service, manage jobs, inspect state, run the local broker.

The root parser and its global flags, the verbs each group registers
(:mod:`.ops`, :mod:`.jobs`, :mod:`.search`, :mod:`.bulk`) with the handler
that runs them, and the exit codes: 0 done, 1 a permanent error or a verdict
other than asked, 2 a temporary error (worth trying again).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from lakeprop.cli import bulk, jobs, ops, search
from lakeprop.errors import LakepropError


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
    ops.register_run(sub)
    jobs.register(sub)
    ops.register(sub)
    search.register(sub)
    bulk.register(sub)
    ops.register_broker(sub)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return int(args.handler(args))
    except LakepropError as exc:
        print(f"error [{exc.code}]: {exc}", file=sys.stderr)
        return 2 if exc.is_temporary else 1


if __name__ == "__main__":
    sys.exit(main())
