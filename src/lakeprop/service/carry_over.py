"""Carrying a checkpoint of the tick source over to the wake source.

Before the wake topic (:mod:`lakeprop.service.wake`), the query's second source
was a ``rate-micro-batch`` tick. A checkpoint fixes its query's sources, so the
query over the wake topic cannot resume one written with the tick. At start,
:func:`carry_over` finds such a checkpoint by its latest offset file (the
second source's offsets are not a Kafka topic's) and:

1. reads the change log offsets its last committed micro-batch read up to
   (``commits/<n>`` names the batch, ``offsets/<n>`` holds them), and writes
   them to ``<checkpoint>/carried-over.json``;
2. moves Spark's files of the old query to ``<checkpoint>/tick-source/``, the
   offset log last;
3. returns the offsets, where the new query starts reading the change log.

A micro-batch the old query began and did not commit is read again by the new
one, as a restart would. A crash in between is finished at the next start: the
marker keeps the offsets once the files that held them are moved.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from lakeprop.errors import InvalidConfigError
from lakeprop.tables.hadoop import Files

log = logging.getLogger(__name__)

MARKER = "carried-over.json"
RETIRED = "tick-source"
SPARK_ENTRIES = ("commits", "sources", "state", "metadata", ".metadata.crc", "offsets")
"""What Spark keeps in a checkpoint, in the order they are moved: the offset log
last, since it is what says the checkpoint is still the old query's."""


@dataclass(frozen=True)
class Carried:
    """A checkpoint of the tick source, carried over."""

    offsets: dict[int, int] | None
    """Each change log partition's next offset (None: no micro-batch was committed,
    so the new query starts at ``kafka.starting_offsets``)."""


def carry_over(files: Files, checkpoint: str, topic: str) -> Carried | None:
    """Carry a checkpoint of the tick source over (see the module docstring); None
    when the checkpoint is not one (new, or already of the wake topic)."""
    root = checkpoint.rstrip("/")
    marker = _read_marker(files, f"{root}/{MARKER}")
    latest = _latest_batch(files, f"{root}/offsets")
    if latest is None:
        return marker  # carried over, and the new query has not planned a batch yet
    if not _of_tick_source(_sources(files, f"{root}/offsets/{latest}")):
        return None
    if marker is None:
        marker = Carried(_committed_offsets(files, root, topic))
        files.write_text(f"{root}/{MARKER}", json.dumps({"offsets": marker.offsets}))
    for name in SPARK_ENTRIES:
        if files.exists(f"{root}/{name}"):
            files.move(f"{root}/{name}", f"{root}/{RETIRED}/{name}")
    log.warning(
        "carried the checkpoint %s of the tick source over to the wake topic: the change log "
        "is read on from %s; the old query's files are in %s/%s",
        root,
        "its start" if marker.offsets is None else marker.offsets,
        root,
        RETIRED,
    )
    return marker


def _read_marker(files: Files, location: str) -> Carried | None:
    text = files.read_text(location)
    if text is None:
        return None
    offsets = json.loads(text)["offsets"]
    return Carried(None if offsets is None else {int(p): int(o) for p, o in offsets.items()})


def _latest_batch(files: Files, directory: str) -> int | None:
    batches = [int(name) for name in files.names(directory) if name.isdigit()]
    return max(batches, default=None)


def _sources(files: Files, location: str) -> list[Any]:
    """The source offsets of one offset file: the JSON lines after the version and
    the batch metadata."""
    lines = [line for line in files.lines(location) if line.strip()]
    return [json.loads(line) if line.startswith("{") else None for line in lines[2:]]


def _of_tick_source(sources: list[Any]) -> bool:
    """Whether an offset file is the tick query's: a Kafka source's offsets map a
    topic to partition offsets, the rate source's do not."""
    if len(sources) != 2:
        return False
    second = sources[1]
    return not (isinstance(second, dict) and all(isinstance(v, dict) for v in second.values()))


def _committed_offsets(files: Files, root: str, topic: str) -> dict[int, int] | None:
    """The change log offsets the last committed micro-batch read up to."""
    committed = _latest_batch(files, f"{root}/commits")
    if committed is None:
        return None
    for source in _sources(files, f"{root}/offsets/{committed}"):
        if isinstance(source, dict) and topic in source:
            return {int(p): int(o) for p, o in source[topic].items()}
    raise InvalidConfigError(
        f"the checkpoint {root} has no offsets of the change log topic {topic} in "
        f"offsets/{committed}: is kafka.topic the topic it was written with?"
    )


def starting_offsets(carried: Carried, partitions: list[int]) -> dict[int, int] | None:
    """Where the new query starts in each of the change log's ``partitions``: the
    carried offset, or the partition's start for one added since (-2, Spark's
    "earliest"); None: at ``kafka.starting_offsets``."""
    if carried.offsets is None:
        return None
    return {p: carried.offsets.get(p, -2) for p in sorted(partitions)}
