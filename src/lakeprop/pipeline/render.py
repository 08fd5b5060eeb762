"""The pipeline graph drawn: as an indented tree of text, as Mermaid, or as DOT.

Tables are the graph's nodes and jobs its edges, from a job's source (and each
table it joins) to its target; a job whose target is no table (a Kafka change feed, a vector index)
ends in a node of its own. Pure: what ``lakeprop graph`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from lakeprop.pipeline.graph import Graph, Node, Table
from lakeprop.spec import JobKey


def name(table: Table) -> str:
    return f"{table[0]}.{table[1]}"


def selected(graph: Graph, database: str | None = None, job: JobKey | None = None) -> Graph:
    """The part of ``graph`` to draw: the chains through ``job`` (its jobs above and
    below), or the jobs reading or writing tables of ``database``, or all."""
    if job is not None:
        keep = {job, *graph.above(job), *graph.below(job)} if job in graph.nodes else set()
        nodes = [n for k, n in graph.nodes.items() if k in keep]
    elif database is not None:
        db = database.lower()
        nodes = [
            n
            for n in graph.nodes.values()
            if n.source[0] == db or (n.target is not None and n.target[0] == db)
        ]
    else:
        nodes = list(graph.nodes.values())
    return Graph.of(nodes)


def _ordered(graph: Graph) -> list[Node]:
    return sorted(graph.nodes.values(), key=lambda n: (n.source, n.key))


def text(graph: Graph, label: Callable[[JobKey], str]) -> str:
    """Each chain as a tree from the tables no drawn job writes::

    db.orders
      ├─ copy (replica, completed) → db.orders_copy
      │    └─ feed (kafka_changefeed, completed) → (no table)
      └─ cdc (auto_cdc, completed) → db.orders_cdc
           └─ totals (aggregate_view, completed) → db.orders_cdc_totals
    """
    lines: list[str] = []
    written = {n.target for n in graph.nodes.values() if n.target is not None}
    roots = sorted({n.source for n in graph.nodes.values() if n.source not in written})
    drawn: set[JobKey] = set()

    def walk(table: Table, indent: str) -> None:
        readers = [key for key in graph.readers(table) if key not in drawn]
        drawn.update(readers)
        for n, key in enumerate(readers):
            last = n == len(readers) - 1
            node = graph.nodes[key]
            target = "(no table)" if node.target is None else name(node.target)
            if node.joined:
                target += f" (joins {', '.join(name(t) for t in node.joined)})"
            glyph = "└─" if last else "├─"
            lines.append(f"{indent}  {glyph} {key.job_name} ({label(key)}) → {target}")
            if node.target is not None:
                walk(node.target, indent + ("     " if last else "  │  "))

    for root in roots:
        lines.append(name(root))
        walk(root, "")
    return "\n".join(lines)


def _ids(graph: Graph) -> dict[Table | JobKey, str]:
    """Short node ids: a table's, or a target-less job's own end node."""
    ids: dict[Table | JobKey, str] = {}
    for node in _ordered(graph):
        for table in (node.source, *node.joined, node.target):
            if table is not None and table not in ids:
                ids[table] = f"t{len(ids)}"
        if node.target is None:
            ids[node.key] = f"t{len(ids)}"
    return ids


def _drawn(
    graph: Graph, label: Callable[[JobKey], str]
) -> tuple[list[tuple[str, str, bool]], list[tuple[str, str, str]]]:
    """(id, text, is a job's own end) of every node and (from, to, text) of every
    edge, in a stable order: what Mermaid and DOT both draw."""
    ids = _ids(graph)
    nodes = [
        (
            ident,
            label(thing) if isinstance(thing, JobKey) else name(thing),
            isinstance(thing, JobKey),
        )
        for thing, ident in ids.items()
    ]
    edges = [
        (ids[table], ids[n.key] if n.target is None else ids[n.target], _edge(n, label))
        for n in _ordered(graph)
        for table in n.reads
    ]
    return nodes, edges


def mermaid(graph: Graph, label: Callable[[JobKey], str]) -> str:
    """A Mermaid flowchart, left to right."""
    nodes, edges = _drawn(graph, label)
    lines = ["flowchart LR"]
    for ident, text, end in nodes:
        lines.append(f'  {ident}[/"{_quoted(text)}"/]' if end else f'  {ident}["{text}"]')
    lines += [f'  {a} -->|"{_quoted(text)}"| {b}' for a, b, text in edges]
    return "\n".join(lines)


def dot(graph: Graph, label: Callable[[JobKey], str]) -> str:
    """A Graphviz digraph, left to right."""
    nodes, edges = _drawn(graph, label)
    lines = ["digraph lakeprop {", "  rankdir=LR;", "  node [shape=box];"]
    for ident, text, end in nodes:
        shape = ", shape=parallelogram" if end else ""
        lines.append(f'  {ident} [label="{_escaped(text)}"{shape}];')
    lines += [f'  {a} -> {b} [label="{_escaped(text)}"];' for a, b, text in edges]
    lines.append("}")
    return "\n".join(lines)


def _edge(node: Node, label: Callable[[JobKey], str]) -> str:
    return f"{node.key.job_name}: {label(node.key)}"


def _quoted(value: str) -> str:
    return value.replace('"', "#quot;")


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


FORMATS: Mapping[str, Callable[[Graph, Callable[[JobKey], str]], str]] = {
    "text": text,
    "mermaid": mermaid,
    "dot": dot,
}
"""How ``lakeprop graph --format`` draws."""


def labels(jobs: Sequence[tuple[JobKey, str, str]]) -> Callable[[JobKey], str]:
    """A job's label from (key, consumer type, state): ``auto_cdc, completed``."""
    by_key = {key: f"{consumer}, {state}" for key, consumer, state in jobs}
    return lambda key: by_key.get(key, "")
