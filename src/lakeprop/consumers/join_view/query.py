"""The shape of a ``join_view`` query: what a join kept from both change feeds can be.

A join view is defined by one Spark SQL statement::

    SELECT o.id, o.amount, c.name AS customer
    FROM sales.orders AS o
    LEFT JOIN sales.customers AS c ON o.customer_id = c.id
    [JOIN ... ON ...]
    [WHERE <condition>]

It is parsed with sqlglot's Spark dialect (a real SQL parser; no text is matched
by hand) into a :class:`JoinQuery`, a value object that names each source, each
join's kind and equality pairs, each output column with the source columns it
reads, and the filter. Two or three tables, joined ``INNER`` or ``LEFT`` on
equalities of columns, with deterministic projections and a deterministic
``WHERE``: that is what the change of a join can be computed for from one side's
change feed against the other side at a pinned version. Everything else is
refused here, at registration, with the construct named:

* a join on anything but a conjunction of column equalities (``<``, ``OR``, a
  literal), ``USING``, ``NATURAL``, ``CROSS``, ``SEMI``/``ANTI``, ``RIGHT`` (written
  as a ``LEFT`` join with the sides swapped) and ``FULL OUTER``;
* subqueries, common table expressions, set operations, ``DISTINCT``;
* aggregates, ``GROUP BY``, ``HAVING`` and window functions: an aggregate over a
  join is an ``aggregate_view`` job reading the join's target, the next step of
  a pipeline;
* ``ORDER BY``, ``LIMIT`` and the like, which a table does not keep;
* non-deterministic functions (``rand``, ``uuid``, ``current_timestamp``, ...):
  a row must come out the same in every iteration and after a replay;
* ``*``, unqualified columns and unknown aliases: every column names its table,
  so what each source must hold is known before any table is read.

Spark's analyzer still checks each expression against the sources' schemas when
the job is registered (types, functions that exist); this module needs no Spark.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError
from lakeprop.identifiers import quote, validate_identifier

MAX_TABLES = 3
"""A join view reads two or three tables."""

RESERVED_PREFIX = "__"
"""Output names the consumer keeps for its own columns (a source's key, say)."""

_CLAUSES = {
    "with_": "WITH (a common table expression)",
    "distinct": "DISTINCT",
    "group": "GROUP BY",
    "having": "HAVING",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "order": "ORDER BY",
    "sort": "SORT BY",
    "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "laterals": "LATERAL VIEW",
    "pivots": "PIVOT",
    "hint": "a hint",
    "into": "INTO",
    "locks": "a lock clause",
    "sample": "TABLESAMPLE",
}
"""Clauses of a SELECT a join view cannot keep, by sqlglot's name for them."""

_SELECT_ARGS = {"expressions", "from_", "joins", "where", "kind"}
"""What a join view's SELECT may set (``kind`` is sqlglot's, and empty here)."""

_NON_DETERMINISTIC = frozenset(
    {
        "rand",
        "randn",
        "random",
        "uuid",
        "shuffle",
        "now",
        "current_date",
        "current_time",
        "current_timestamp",
        "current_timezone",
        "localtimestamp",
        "current_user",
        "user",
        "session_user",
        "monotonically_increasing_id",
        "spark_partition_id",
        "input_file_name",
        "input_file_block_start",
        "input_file_block_length",
        "unix_timestamp",
        "uniform",
        "randstr",
        "reflect",
        "java_method",
        "try_reflect",
        "current_database",
        "current_schema",
        "current_catalog",
    }
)
"""Functions whose answer for the same row changes between evaluations, or that
reach outside the row (``reflect``), by name. ``unix_timestamp()`` without
arguments is the current time; with them it is a conversion, but both are
refused: ``to_unix_timestamp`` says the latter plainly. Spark's analyzer checks
determinism again at registration, for what this list cannot know (a UDF)."""

_GENERATORS = frozenset({"json_tuple", "explode_outer", "posexplode_outer", "inline_outer"})
"""Functions that make several rows of one (by name, beside sqlglot's ``UDTF`` class)."""

_TABLE_ARGS = {"this", "db", "alias"}
"""What a table in FROM or JOIN may carry: no time travel, sample, hint or the like
(the consumer pins each source's version itself)."""

_JOIN_ARGS = {"this", "side", "kind", "on", "method", "using"}
"""What a JOIN may set (``method`` and ``using`` are then refused by name)."""

JoinKind = Literal["inner", "left"]


@dataclass(frozen=True)
class Source:
    """A table of the join, as jobs name their sources, and the alias the query uses."""

    alias: str
    database: str
    table: str

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"


@dataclass(frozen=True)
class Column:
    """A source column the query reads, by its source's alias."""

    alias: str
    name: str

    def sql(self) -> str:
        return f"{quote(self.alias)}.{quote(self.name)}"


@dataclass(frozen=True)
class Join:
    """One ``JOIN``: its kind, the table it adds, and its equalities, each an
    (earlier table's column, this table's column) pair."""

    kind: JoinKind
    source: Source
    on: tuple[tuple[Column, Column], ...]


@dataclass(frozen=True)
class Output:
    """A column of the view: its name, its Spark SQL expression and what it reads."""

    name: str
    sql: str
    reads: tuple[Column, ...]


@dataclass(frozen=True)
class JoinQuery:
    """A ``join_view`` query, checked for the shape the incremental join keeps."""

    first: Source
    joins: tuple[Join, ...]
    outputs: tuple[Output, ...]
    where: str | None
    where_reads: tuple[Column, ...]

    @property
    def sources(self) -> tuple[Source, ...]:
        """Every table of the join, the first (the one the job is registered on) first."""
        return (self.first, *(j.source for j in self.joins))

    def reads(self, alias: str) -> tuple[str, ...]:
        """The columns of the source ``alias`` the view reads (outputs, joins, filter),
        in first-use order."""
        seen: dict[str, str] = {}
        for column in self._all_reads():
            if column.alias == alias:
                seen.setdefault(column.name.lower(), column.name)
        return tuple(seen.values())

    def _all_reads(self) -> Iterator[Column]:
        for output in self.outputs:
            yield from output.reads
        for join in self.joins:
            for left, right in join.on:
                yield left
                yield right
        yield from self.where_reads


def parse_join_query(text: str, what: str = "join_view option query") -> JoinQuery:
    """Parse and check ``text``; raise InvalidConsumerOptionsError naming the first
    construct outside the shape a join view keeps."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidConsumerOptionsError(f"{what} must be a non-empty SQL SELECT")
    return _parsed(text, what)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str, what: str) -> JoinQuery:
    """:func:`parse_join_query` of a string, parsed once (the value is frozen): the
    graph, the tenants' census and trigger selection ask for a join's tables each
    time they look at its job. A refusal is not kept: it is raised every time."""
    try:
        statements = [s for s in sqlglot.parse(text, read="spark") if s is not None]
    except ParseError as exc:
        first = str(exc).strip().splitlines()[0][:300]
        raise InvalidConsumerOptionsError(f"{what} is not valid SQL: {first}") from None
    if len(statements) != 1:
        raise InvalidConsumerOptionsError(
            f"{what} must be one SELECT statement, got {len(statements)}"
        )
    return _Checker(what).query(statements[0])


class _Checker:
    def __init__(self, what: str) -> None:
        self.what = what
        self.aliases: dict[str, Source] = {}

    def refuse(self, construct: str, why: str = "") -> InvalidConsumerOptionsError:
        return InvalidConsumerOptionsError(
            f"{self.what}: {construct} is not supported in a join view"
            + (f" ({why})" if why else "")
        )

    def query(self, statement: exp.Expr) -> JoinQuery:
        if isinstance(statement, exp.SetOperation):
            raise self.refuse(
                f"{type(statement).__name__.upper()} (a set operation)",
                "a join view is one SELECT",
            )
        if not isinstance(statement, exp.Select):
            raise self.refuse(f"a {type(statement).__name__} statement", "it must be a SELECT")
        for key, value in statement.args.items():
            if value and key not in _SELECT_ARGS:
                raise self.refuse(_CLAUSES.get(key, f"the clause {key!r}"), _why(key))
        self._forbid_anywhere(statement)
        first = self.source(statement.args.get("from_"))
        joins = tuple(self.join(j) for j in statement.args.get("joins") or ())
        if not joins:
            raise InvalidConsumerOptionsError(
                f"{self.what} reads one table: a join view joins two or three (a single "
                "table's derivation is a replica, an index or an aggregate view)"
            )
        if len(joins) + 1 > MAX_TABLES:
            raise self.refuse(f"a join of {len(joins) + 1} tables", f"at most {MAX_TABLES}")
        outputs = tuple(self.output(e) for e in statement.expressions)
        names: dict[str, str] = {}
        for output in outputs:
            if output.name.lower() in names:
                raise InvalidConsumerOptionsError(
                    f"{self.what} names the output column {output.name} twice"
                )
            names[output.name.lower()] = output.name
        where = statement.args.get("where")
        condition = where.this if isinstance(where, exp.Where) else None
        return JoinQuery(
            first=first,
            joins=joins,
            outputs=outputs,
            where=_spark_sql(condition) if condition is not None else None,
            where_reads=self.columns(condition) if condition is not None else (),
        )

    def _forbid_anywhere(self, statement: exp.Expr) -> None:
        """What may appear nowhere in the statement: subqueries, aggregates, windows,
        non-deterministic functions, ``*``."""
        for node in statement.walk():
            if node is statement:
                continue
            if isinstance(node, exp.Query | exp.Subquery):
                raise self.refuse(f"a subquery ({_short(node)})", "join the table instead")
            if isinstance(node, exp.Window):
                raise self.refuse(
                    f"the window function {_short(node)}",
                    "rank or aggregate in a job that reads the view's target",
                )
            if isinstance(node, exp.AggFunc):
                raise self.refuse(
                    f"the aggregate {_short(node)}",
                    "an aggregate over a join is an aggregate_view job that reads the "
                    "join view's target",
                )
            if isinstance(node, exp.UDTF) or (
                isinstance(node, exp.Func) and _function_name(node) in _GENERATORS
            ):
                raise self.refuse(
                    f"the generator {_short(node)}",
                    "each row of the view holds one row of each table",
                )
            if isinstance(node, exp.Func) and _function_name(node) in _NON_DETERMINISTIC:
                raise self.refuse(
                    f"the non-deterministic function {_function_name(node)}()",
                    "a row must come out the same in every iteration and after a replay",
                )
            if isinstance(node, exp.Star):
                raise self.refuse("*", "name each column the view keeps, with its table")

    def source(self, node: exp.Expr | None) -> Source:
        table = node.this if isinstance(node, exp.From | exp.Join) else node
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            raise self.refuse(f"reading {_short(table)}", "name a table as database.table")
        extra = sorted(k for k, v in table.args.items() if v and k not in _TABLE_ARGS | {"catalog"})
        if extra:
            raise self.refuse(
                f"{_short(table)} ({', '.join(extra)})",
                "a table is named alone; the view pins each table's version itself",
            )
        alias_node = table.args.get("alias")
        if isinstance(alias_node, exp.TableAlias) and alias_node.args.get("columns"):
            raise self.refuse(
                f"renaming the columns of {table.name} in its alias",
                "refer to each column by its own name",
            )
        if table.args.get("catalog"):
            raise self.refuse(
                f"the catalog-qualified table {_short(table)}",
                "name it as database.table, as jobs name their sources",
            )
        if not table.db:
            raise InvalidConsumerOptionsError(
                f"{self.what} names the table {table.name} without its database: "
                "name it as database.table, as jobs name their sources"
            )
        database = _identifier(table.db, f"{self.what} database")
        name = _identifier(table.name, f"{self.what} table")
        alias = _identifier(table.alias or name, f"{self.what} alias")
        source = Source(alias, database, name)
        if any(s.name.lower() == source.name.lower() for s in self.aliases.values()):
            raise self.refuse(f"joining {source.name} with itself")
        if alias.lower() in self.aliases:
            raise InvalidConsumerOptionsError(
                f"{self.what} uses the alias {alias} for two tables: give each its own"
            )
        self.aliases[alias.lower()] = source
        return source

    def join(self, node: exp.Join) -> Join:
        side, kind = (node.side or "").upper(), (node.kind or "").upper()
        extra = sorted(k for k, v in node.args.items() if v and k not in _JOIN_ARGS)
        if extra:
            raise self.refuse(f"JOIN with {', '.join(extra)}")
        if kind == "OUTER" and not side:
            raise self.refuse("OUTER JOIN without LEFT", "write LEFT JOIN or JOIN")
        if node.args.get("method"):
            raise self.refuse(f"{node.args['method']} JOIN", "write ON with the equalities")
        if node.args.get("using"):
            raise self.refuse("JOIN ... USING", "write ON a.key = b.key")
        if side == "RIGHT":
            raise self.refuse("RIGHT JOIN", "write it as a LEFT JOIN with the tables swapped")
        if side == "FULL":
            raise self.refuse("FULL OUTER JOIN", "inner and left joins are")
        if kind in ("CROSS", "SEMI", "ANTI") or (kind and kind not in ("INNER", "OUTER")):
            raise self.refuse(f"{(side + ' ' + kind).strip()} JOIN", "inner and left joins are")
        joined: JoinKind = "left" if side == "LEFT" else "inner"
        earlier = set(self.aliases)
        source = self.source(node)
        condition = node.args.get("on")
        if condition is None or (isinstance(condition, exp.Boolean) and condition.this is True):
            raise self.refuse(
                f"a join of {source.name} without ON", "a join view joins on equalities"
            )
        pairs = tuple(self.pair(eq, earlier, source) for eq in _conjuncts(condition))
        return Join(joined, source, pairs)

    def pair(self, node: exp.Expr, earlier: set[str], joined: Source) -> tuple[Column, Column]:
        """An equality of a column of an earlier table and one of the joined table."""
        if not isinstance(node, exp.EQ):
            raise self.refuse(
                f"the join condition {_short(node)}",
                "a join view joins on equalities of columns joined by AND; a filter goes in WHERE",
            )
        sides = [node.this, node.expression]
        if not all(isinstance(side, exp.Column) for side in sides):
            raise self.refuse(
                f"the join condition {_short(node)}",
                "each side of an equality is a column; a filter goes in WHERE",
            )
        first, second = (self.column(side) for side in sides)
        if second.alias.lower() == joined.alias.lower() and first.alias.lower() in earlier:
            return first, second
        if first.alias.lower() == joined.alias.lower() and second.alias.lower() in earlier:
            return second, first
        raise self.refuse(
            f"the join condition {_short(node)}",
            f"it must equate a column of {joined.alias} with one of a table joined before it",
        )

    def output(self, node: exp.Expr) -> Output:
        if isinstance(node, exp.Alias):
            name, expression = node.alias, node.this
        elif isinstance(node, exp.Column):
            name, expression = node.name, node
        else:
            raise InvalidConsumerOptionsError(
                f"{self.what}: name the output column {_short(node)} with AS"
            )
        _identifier(name, f"{self.what} output column")
        if name.startswith(RESERVED_PREFIX):
            raise InvalidConsumerOptionsError(
                f"{self.what} output column {name}: names starting with "
                f"{RESERVED_PREFIX} are the consumer's own"
            )
        return Output(name, _spark_sql(expression), self.columns(expression))

    def columns(self, node: exp.Expr) -> tuple[Column, ...]:
        return tuple(self.column(c) for c in node.find_all(exp.Column))

    def column(self, node: exp.Column) -> Column:
        if not node.table:
            raise InvalidConsumerOptionsError(
                f"{self.what}: qualify the column {node.name} with its table's alias "
                f"(one of {sorted(s.alias for s in self.aliases.values())})"
            )
        if node.args.get("db") or node.args.get("catalog"):
            raise InvalidConsumerOptionsError(
                f"{self.what}: refer to the column {_short(node)} by its table's alias"
            )
        source = self.aliases.get(node.table.lower())
        if source is None:
            raise InvalidConsumerOptionsError(
                f"{self.what}: the column {_short(node)} names no table of the query "
                f"(its aliases: {sorted(s.alias for s in self.aliases.values())})"
            )
        return Column(source.alias, _identifier(node.name, f"{self.what} column"))


def _identifier(value: str, what: str) -> str:
    try:
        return validate_identifier(value, what)
    except InvalidIdentifierError as exc:
        raise InvalidConsumerOptionsError(str(exc)) from None


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    """The terms of an AND chain (a parenthesised one too)."""
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return [*_conjuncts(node.this), *_conjuncts(node.expression)]
    return [node]


def _function_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def _spark_sql(node: exp.Expr) -> str:
    return node.sql(dialect="spark", identify=True)


def _short(node: exp.Expr | None) -> str:
    text = node.sql(dialect="spark") if node is not None else "nothing"
    return text if len(text) <= 80 else text[:77] + "..."


def _why(key: str) -> str:
    if key in ("group", "having"):
        return "an aggregate over a join is an aggregate_view job that reads the join view's target"
    if key == "with_":
        return "join the tables in the one SELECT"
    if key in ("order", "sort", "limit", "offset", "cluster", "distribute"):
        return "a table keeps its rows in no order; read the target with it"
    if key == "distinct":
        return "the view's rows are identified by its sources' keys"
    return ""
