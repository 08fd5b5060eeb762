"""Entry point of the streaming service for spark-submit and Databricks script tasks.

    spark-submit ... jobs/propagate.py --config conf/cluster.toml [--set key=value ...]

Everything else lives in the library; this file only hands over its arguments.
"""

from __future__ import annotations

import sys

from lakeprop.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    # Global options go before the sub-command.
    sys.exit(main([*args, "run"]))
