"""The pipeline graph: which jobs read which jobs' targets. Pure, no Spark.

A job reads one table (its source) and, for consumer types whose target is a
Delta table (``ConsumerType.table_target``), writes one
(:func:`~lakeprop.spec.target_table`). A job whose source is another job's
target is that job's *downstream*: the two make a chain, and chains make a
graph over the live jobs. Tables are compared by name, case-insensitively, as
Spark compares them.

The graph must stay acyclic: a job that would read, through any number of
steps, what it writes itself is rejected at registration
(:meth:`Graph.cycle_with`), naming the jobs of the cycle. Each target has one
writer: a job that would write a table another live job writes, whatever the
account, the database or the case of its name, is rejected naming that job
(:meth:`Graph.other_writers`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lakeprop.errors import UnknownConsumerError
from lakeprop.registry import get_consumer_type
from lakeprop.spec import JobKey, JobSpec, target_table

Table = tuple[str, str]
"""(database, table), lower-cased."""


def table_of(database: str, table: str) -> Table:
    return database.lower(), table.lower()


def consumer_target(key: JobKey, spec: JobSpec) -> Table | None:
    """The table a job writes that others may read, or None (a Kafka topic, an index
    read through search)."""
    consumer = spec.iteration.consumer
    return target_of_consumer(key, consumer.type, consumer.options)


def target_of_consumer(key: JobKey, consumer_type: str, options: Mapping[str, Any]) -> Table | None:
    """:func:`consumer_target` of a consumer type and its validated options."""
    if not get_consumer_type(consumer_type).table_target:
        return None
    return table_of(*target_table(key, options))


def stored_target(key: JobKey, job_spec: str) -> Table | None:
    """:func:`consumer_target` of a spec as the catalog stores it (validated when it
    was registered): read without validating it again, for a graph of every job.
    A custom consumer type this process cannot import (a reader elsewhere than
    the service) counts as writing its target, as the consumer base does."""
    return spec_target(key, json.loads(job_spec))


def spec_target(key: JobKey, spec: Mapping[str, Any]) -> Table | None:
    """:func:`stored_target` of the spec's JSON, parsed."""
    consumer = spec["iteration"]["consumer"]
    options = consumer.get("options") or {}
    try:
        return target_of_consumer(key, consumer["type"], options)
    except UnknownConsumerError:
        return table_of(*target_table(key, options))


@dataclass(frozen=True)
class Node:
    """One live job in the graph: what it reads and what it writes."""

    key: JobKey
    source: Table
    target: Table | None
    joined: tuple[Table, ...] = ()
    """The tables it reads beside its source (a join): it is their reader too."""

    @property
    def reads(self) -> tuple[Table, ...]:
        """Every table the job reads, its source first."""
        return (self.source, *self.joined)

    @classmethod
    def stored(cls, key: JobKey, job_spec: str) -> Node:
        """The node of a job as the catalog stores it (:func:`stored_target`)."""
        return cls.of_spec(key, json.loads(job_spec))

    @classmethod
    def of_spec(cls, key: JobKey, spec: Mapping[str, Any]) -> Node:
        """The node of a job from its stored spec's JSON, parsed (:func:`spec_target`)."""
        consumer = spec["iteration"]["consumer"]
        return cls(
            key,
            table_of(key.database, key.table),
            spec_target(key, spec),
            joined_of(consumer["type"], consumer.get("options") or {}),
        )


def joined_of(consumer_type: str, options: Mapping[str, Any]) -> tuple[Table, ...]:
    """The tables a consumer reads beside its source (:attr:`Node.joined`); none for a
    type this process cannot import."""
    try:
        joined = get_consumer_type(consumer_type).joined_sources(options)
    except UnknownConsumerError:
        return ()
    return tuple(table_of(j.database, j.table) for j in joined)


TargetOf = Callable[[JobKey, JobSpec], "Table | None"]


class Graph:
    """The live jobs as a graph of tables: kept current as jobs come and go."""

    def __init__(self, target_of: TargetOf = consumer_target) -> None:
        self._target_of = target_of
        self.nodes: dict[JobKey, Node] = {}
        self._readers: dict[Table, set[JobKey]] = {}
        self._writers: dict[Table, set[JobKey]] = {}

    @classmethod
    def of(cls, nodes: Iterable[Node], target_of: TargetOf = consumer_target) -> Graph:
        graph = cls(target_of)
        for node in nodes:
            graph.put(node)
        return graph

    def node_for(self, key: JobKey, spec: JobSpec) -> Node:
        consumer = spec.iteration.consumer
        return Node(
            key,
            table_of(key.database, key.table),
            self._target_of(key, spec),
            joined_of(consumer.type, consumer.options),
        )

    def add(self, key: JobKey, spec: JobSpec) -> None:
        self.put(self.node_for(key, spec))

    def put(self, node: Node) -> None:
        key = node.key
        self.remove(key)
        self.nodes[key] = node
        for table in node.reads:
            self._readers.setdefault(table, set()).add(key)
        if node.target is not None:
            self._writers.setdefault(node.target, set()).add(key)

    def remove(self, key: JobKey) -> None:
        node = self.nodes.pop(key, None)
        if node is None:
            return
        for table in node.reads:
            self._readers[table].discard(key)
        if node.target is not None:
            self._writers[node.target].discard(key)

    def readers(self, table: Table) -> list[JobKey]:
        """The jobs that read ``table`` (their source, or a table they join)."""
        return sorted(self._readers.get(table, ()))

    def writers(self, table: Table) -> list[JobKey]:
        """The jobs whose target is ``table``."""
        return sorted(self._writers.get(table, ()))

    def downstream(self, key: JobKey) -> list[JobKey]:
        """The jobs that read ``key``'s target, one step down."""
        node = self.nodes.get(key)
        return [] if node is None or node.target is None else self.readers(node.target)

    def upstream(self, key: JobKey) -> list[JobKey]:
        """The jobs that write a table ``key`` reads, one step up."""
        node = self.nodes.get(key)
        return [] if node is None else sorted({w for t in node.reads for w in self.writers(t)})

    def below(self, key: JobKey, account: int | None = None) -> list[JobKey]:
        """Every job downstream of ``key``, at any depth, nearest first; with
        ``account``, only its jobs, reached through its jobs alone."""
        if account is None:
            return list(self._walk(key, self.downstream))[1:]

        def step(k: JobKey) -> list[JobKey]:
            return [d for d in self.downstream(k) if d.account_id == account]

        return list(self._walk(key, step))[1:]

    def other_writers(self, key: JobKey, spec: JobSpec) -> list[JobKey]:
        """The live jobs other than ``key`` that write the table ``key`` with ``spec``
        would write: there must be none (one writer per target)."""
        target = self.node_for(key, spec).target
        return [] if target is None else [k for k in self.writers(target) if k != key]

    def above(self, key: JobKey) -> list[JobKey]:
        """Every job upstream of ``key``, at any depth, nearest first."""
        return list(self._walk(key, self.upstream))[1:]

    @staticmethod
    def _walk(start: JobKey, step: Callable[[JobKey], list[JobKey]]) -> Iterator[JobKey]:
        seen = {start}
        queue = deque([start])
        while queue:
            key = queue.popleft()
            yield key
            for nxt in step(key):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)

    def cycle_with(self, key: JobKey, spec: JobSpec) -> list[JobKey] | None:
        """The jobs of the cycle ``key`` with ``spec`` would close, starting with
        ``key`` and in the order the data flows, or None when there is none."""
        node = self.node_for(key, spec)
        if node.target is None:
            return None
        if node.target in node.reads:
            return [key]
        path = self._path(node.target, set(node.reads), key)
        return None if path is None else [key, *path]

    def _path(self, start: Table, goals: set[Table], without: JobKey) -> list[JobKey] | None:
        """The shortest chain of jobs (other than ``without``) that leads from the
        table ``start`` to one of the tables ``goals``, or None."""
        came_from: dict[JobKey, JobKey | None] = {}
        queue: deque[JobKey] = deque()

        def visit(table: Table, previous: JobKey | None) -> None:
            for nxt in self.readers(table):
                if nxt != without and nxt not in came_from:
                    came_from[nxt] = previous
                    queue.append(nxt)

        visit(start, None)
        while queue:
            current = queue.popleft()
            reached = self.nodes[current].target
            if reached in goals:
                path = [current]
                while (back := came_from[path[-1]]) is not None:
                    path.append(back)
                return path[::-1]
            if reached is not None:
                visit(reached, current)
        return None


def describe_cycle(cycle: list[JobKey], graph: Graph, spec: JobSpec) -> str:
    """``db.a -[x]-> db.a_x -[y]-> db.a``: the tables of a cycle and the jobs between."""
    first = graph.node_for(cycle[0], spec)
    steps = [f"{first.source[0]}.{first.source[1]}"]
    for key in cycle:
        node = first if key == cycle[0] else graph.nodes[key]
        assert node.target is not None
        steps.append(f"-[{key.job_name}]-> {node.target[0]}.{node.target[1]}")
    return " ".join(steps)
