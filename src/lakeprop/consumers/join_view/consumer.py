"""The ``join_view`` consumer: a SQL join of two or three Delta tables, kept from
every table's change feed (the plan: :mod:`.plan`; its SQL: :mod:`.sql`).

The job is registered on its query's first table; the other tables are its
*joined* sources (:meth:`JoinViewConsumer.joined_sources`). Its watermark is the
first table's version, and its status keeps the version (and identity) of each
joined table its target reflects. A commit on any of them makes the job due
(the engine plans a tail of the first table, empty when only a joined table
moved). Each iteration pins every table: the first at the tail's end version,
each joined one at its latest version when the iteration starts. It then

1. finds the first table's keys whose rows the changes can touch: the first
   table's own changed keys, and for each joined table that moved, the keys whose
   rows join, through the path to it, any pre- or post-image of its changes;
2. recomputes the view's rows for those keys alone at the pinned versions;
3. MERGEs them into the target on the view's identity (each source's key): a row
   that came out the same is left untouched, a row no longer produced is deleted.

The target is therefore the query at the versions the status names, whatever
order the tables moved in. Recomputing a key again at later versions leaves the
truth there, so the writes need no transaction id: a replay after a crash (whose
watermark or joined versions did not reach the catalog) recomputes at least the
keys the lost write touched (their changes are still in its ranges) and leaves
the same target. A joined table that was re-created, or whose recorded version is
gone, is a resync: the whole view is recomputed and replaces the target.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakeprop.changes.feed import (
    CHANGE_TYPE,
    INSERT,
    POSTIMAGE,
    own_columns,
    schema_changed,
    unreadable,
)
from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.consumers.join_view import sql
from lakeprop.consumers.join_view.options import JoinViewOptions, parse_options
from lakeprop.consumers.join_view.plan import one_row_per_first_key
from lakeprop.consumers.options import TARGET_OPTIONS
from lakeprop.errors import ErrorCode, PermanentError
from lakeprop.faults import fault_point
from lakeprop.identifiers import quote
from lakeprop.registry import JoinedSource
from lakeprop.state.status import JoinedMark
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import CHANGE_FEED_PROPERTY

log = logging.getLogger(__name__)

DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"
"""On for the targets a join view creates: a key's rows are spread over every file
of the view, and a MERGE that marks the replaced rows instead of rewriting their
files costs a fraction (decision 0013)."""
SCANNED_COMMITS = 16
"""A range of up to this many commits is looked at commit by commit for a change of
columns (a log file each); a longer one has its columns at both ends read instead."""
GLOBAL_TEMP = "spark.sql.globalTempDatabase"
"""Where Spark keeps views every session of the application sees."""
_OP = "__jv_op"
"""The MERGE source's column saying whether a row is written (``u``) or deleted (``d``;
NULL: the first table's key has no row in the view any more)."""
_KEY = "__jv_key"
"""The MERGE source's columns of the first table's key (numbered)."""


def _unique(columns: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    for column in columns:
        seen.setdefault(column.lower(), column)
    return tuple(seen.values())


class JoinViewConsumer(Consumer):
    """A join of the job's source with one or two more tables, kept from each one's
    change feed; see the module."""

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        parsed = parse_options(options)
        out: dict[str, Any] = {
            "query": options["query"],
            "keys": {alias: list(columns) for alias, columns in parsed.keys.items()},
        }
        out.update({k: v for k, v in parsed.target.items() if k in TARGET_OPTIONS})
        return out

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        parsed = parse_options(options)
        first = parsed.query.first.alias
        return list(_unique([*parsed.query.reads(first), *parsed.keys[first]]))

    @classmethod
    def joined_sources(cls, options: Mapping[str, Any]) -> list[JoinedSource]:
        parsed = parse_options(options)
        return [
            JoinedSource(
                s.database,
                s.table,
                _unique([*parsed.query.reads(s.alias), *parsed.keys[s.alias]]),
            )
            for s in parsed.query.sources[1:]
        ]

    @classmethod
    def own_source(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        first = parse_options(options).query.first
        return first.database, first.table

    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        self.view: JoinViewOptions = parse_options(context.options)
        self.names = {s.alias: s.name for s in self.view.query.sources}
        self._prefix = f"__jv{context.job_id}_{uuid.uuid4().hex[:8]}"
        """This iteration's views: global (the change set was read in the worker's
        session, the SQL runs in this member's), named apart, dropped at the end."""
        self._schema = str(context.spark.conf.get(GLOBAL_TEMP, "global_temp"))
        self._made: list[str] = []
        self._keyed_joins = one_row_per_first_key(self.view.query, self.view.keys)
        """Every join meets its table's whole key (whether each pair of joined columns
        is also of one type is known once the tables are read: :meth:`_by_key_of`)."""

    # -- the engine's two calls ---------------------------------------------------

    def snapshot(self, rows: DataFrame, version: int) -> int:
        with self._views_dropped():
            return self._rebuild(self._kept(rows), version, self._pinned())

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        with self._views_dropped():
            return self._apply(changes, from_version, to_version)

    @contextmanager
    def _views_dropped(self) -> Iterator[None]:
        """The views this iteration registers dropped on the way out; a query that no
        longer resolves against the tables explained."""
        try:
            yield
        except AnalysisException as exc:
            explained = _explained(exc, self.view)
            if explained is exc:
                raise
            raise explained from exc
        finally:
            for view in self._made:
                self.context.spark.catalog.dropGlobalTempView(view)

    def _apply(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        target = self.require_target()
        pinned = self._pinned()
        before = self.context.joined_from
        moved = {
            alias: (before[name].version, pinned[name].version)
            for alias, name in self.names.items()
            if name in before and name in pinned and pinned[name].version > before[name].version
        }
        ranges = {**moved, self.first: (from_version, to_version)}
        why = self._why_rebuild(before, pinned) or self._retyped_reads(ranges)
        if why:
            log.info("join view %s is recomputed whole: %s", target, why)
            return self._rebuild(self._first_at(to_version), to_version, pinned)
        rows = self.context.change_rows
        first_moved = rows != 0 and (rows is not None or not changes.isEmpty())
        if not first_moved and not moved:
            self.context.joined.update(before)
            return 0
        try:
            written = self._incremental(
                target, changes if first_moved else None, moved, to_version, pinned
            )
        except Exception as exc:
            if not (moved and (unreadable(exc) or schema_changed(exc))):
                explained = _explained(exc, self.view)
                if explained is exc:
                    raise
                raise explained from exc
            # a joined table's changes are gone, or its columns changed (a widened type
            # can make joined columns of one type, and the MERGE another)
            log.info("join view %s is recomputed whole: %s", target, str(exc).splitlines()[0])
            return self._rebuild(self._first_at(to_version), to_version, pinned)
        self.context.joined.update(pinned)
        return written

    def _incremental(
        self,
        target: Any,
        changes: DataFrame | None,
        moved: Mapping[str, tuple[int, int]],
        to_version: int,
        pinned: Mapping[str, JoinedMark],
    ) -> int:
        """Steps 1 to 3 of the module: the affected keys of the first table's
        ``changes`` (None: it did not move) and of the ``moved`` joined tables'
        changes, their rows recomputed and MERGEd. Where only the first table moved,
        its rows of the affected keys are the last change of each (none for a key
        whose last change took it away): the table itself is not read."""
        if changes is not None and not moved:
            first = self._kept(self._latest_rows(changes))
        else:
            first = self._first_at(to_version)
        views = self._views(first, pinned)
        images: dict[str, str] = {}
        if changes is not None:
            images[self.first] = self._register("d_" + self.first, changes)
        for alias, (start, end) in moved.items():
            images[alias] = self._register("d_" + alias, self._changes_of(alias, start, end))
        spark = self.context.spark
        affected = sql.affected(self.view, views, images, self._schema)
        keys = spark.sql(affected).localCheckpoint()
        if keys.isEmpty():  # no row of the view can have changed (an OPTIMIZE, say)
            return 0
        keys_view = self._register("keys", keys)
        fresh = spark.sql(sql.recompute(self.view, views, keys_view, self._schema))
        widened = _retyped(target.load(target.reader()), fresh)
        if widened:  # a table's column was widened under the job: the target follows
            log.info("join view %s is recomputed whole: %s changed type", target, widened)
            return self._rebuild(self._first_at(to_version), to_version, pinned)
        return self._merge(target, fresh, keys, self._by_key_of(views))

    # -- the tables at their pinned versions ----------------------------------------

    @property
    def first(self) -> str:
        return self.view.query.first.alias

    def _pinned(self) -> dict[str, JoinedMark]:
        """Each joined table's latest version and identity, read once: the versions
        this iteration joins them at."""
        probe = DeltaLogProbe(self.context.spark)
        pinned: dict[str, JoinedMark] = {}
        for source in self.view.query.sources[1:]:
            handle = self.context.locate(source.database, source.table)
            location = handle.location()
            version = probe.latest_version(location) if location else None
            table_id = probe.table_id(location) if location else None
            if version is None or table_id is None:
                try:
                    detail = handle.delta().detail().select("id").first()
                    history = handle.delta().history(1).select("version").first()
                except Exception as exc:
                    raise PermanentError(
                        f"join_view: the joined table {source.name} no longer exists or is "
                        f"not a Delta table ({str(exc).splitlines()[0][:200]}); re-create it "
                        "or re-register the job without it",
                        ErrorCode.SOURCE_NOT_DELTA,
                    ) from None
                table_id = str(detail["id"]) if detail is not None else ""
                version = int(history["version"]) if history is not None else 0
            pinned[source.name] = JoinedMark(version, table_id)
        return pinned

    def _why_rebuild(
        self, before: Mapping[str, JoinedMark], pinned: Mapping[str, JoinedMark]
    ) -> str:
        """Why the joined tables cannot be followed from the versions ``before``."""
        for name, now in pinned.items():
            was = before.get(name)
            if was is None:
                return f"no version of {name} is recorded for the target"
            if was.table_id != now.table_id:
                return f"{name} was re-created (id {was.table_id} is now {now.table_id})"
            if now.version < was.version:
                return f"{name} is at version {now.version}, before {was.version} (restored?)"
        return ""

    def _retyped_reads(self, ranges: Mapping[str, tuple[int, int]]) -> str:
        """A column the view reads whose type changed within a table's range
        ``(start, end]`` (by alias), or "". Spark compares two columns of different
        types at a type it picks from both, so a type widened in place can change
        which rows join, and what an expression gives, with no row changed. A short
        range is looked at only when one of its commits changed the table's metadata
        (one log file per commit); a longer one has its columns at both ends read."""
        probe = DeltaLogProbe(self.context.spark)
        for alias, (start, end) in ranges.items():
            if end <= start:
                continue
            source = next(s for s in self.view.query.sources if s.alias == alias)
            handle = self.context.locate(source.database, source.table)
            if end - start <= SCANNED_COMMITS:
                location = handle.location()
                if location and not probe.metadata_changed(location, start, end):
                    continue
            types: dict[int, dict[str, Any]] = {}
            for version in (start, end):
                try:
                    schema = handle.load(handle.reader().option("versionAsOf", version)).schema
                except Exception as exc:
                    if not unreadable(exc):
                        raise
                    first_line = str(exc).splitlines()[0][:200]
                    return f"{source.name} at version {version} is unreadable: {first_line}"
                types[version] = {f.name.lower(): f.dataType for f in schema}
            reads = _unique([*self.view.query.reads(alias), *self.view.keys[alias]])
            changed = [c for c in reads if types[start].get(c.lower()) != types[end].get(c.lower())]
            if changed:
                return f"{source.name} column(s) {changed} changed type after version {start}"
        return ""

    def _first_at(self, version: int) -> DataFrame:
        key = self.context.key
        source = self.context.locate(key.database, key.table)
        return self._kept(source.load(source.reader().option("versionAsOf", version)))

    def _latest_rows(self, changes: DataFrame) -> DataFrame:
        """The first table's rows at the end of ``changes`` for the keys they hold: the
        last change of each key where it leaves a row (an insert or a post-image)."""
        latest = self.context.latest_changes(changes, list(self.view.keys[self.first]))
        kept = latest.where(F.col(CHANGE_TYPE).isin(INSERT, POSTIMAGE))
        return kept.select(*own_columns(kept.columns))

    def _kept(self, rows: DataFrame) -> DataFrame:
        """The first table's rows the job's ``drop`` rules keep: a row the rules drop
        is in no row of the view, however the view reaches it."""
        keeps = self.context.keeps
        return rows if keeps is None else rows.where(F.expr(keeps))

    def _views(self, first: DataFrame, pinned: Mapping[str, JoinedMark]) -> dict[str, str]:
        """A temporary view of every table at its pinned version, by alias."""
        views = {self.first: self._register(self.first, first)}
        for source in self.view.query.sources[1:]:
            handle = self.context.locate(source.database, source.table)
            version = pinned[source.name].version
            frame = handle.load(handle.reader().option("versionAsOf", version))
            views[source.alias] = self._register(source.alias, frame)
        return views

    def _changes_of(self, alias: str, start: int, end: int) -> DataFrame:
        """The change feed of the joined table ``alias`` in ``(start, end]``."""
        source = next(s for s in self.view.query.sources if s.alias == alias)
        handle = self.context.locate(source.database, source.table)
        reader = (
            handle.reader()
            .option("readChangeFeed", "true")
            .option("startingVersion", start + 1)
            .option("endingVersion", end)
        )
        return handle.load(reader)

    def _register(self, name: str, frame: DataFrame) -> str:
        view = f"{self._prefix}_{name}"
        frame.createOrReplaceGlobalTempView(view)
        self._made.append(view)
        return view

    # -- the writes ---------------------------------------------------------------

    def _rebuild(self, first: DataFrame, version: int, pinned: Mapping[str, JoinedMark]) -> int:
        """Replace the target with the whole view at ``version`` of the first table and
        ``pinned`` versions of the others. No transaction id: a replay must write the
        view at its own pinned versions, which the status then records."""
        views = self._views(first, pinned)
        data = self.context.spark.sql(sql.recompute(self.view, views, None, self._schema))
        self._check_unique(data, self._by_key_of(views))
        writer = (
            data.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option(DELETION_VECTORS_PROPERTY, "true")  # a new target's; see decision 0013
        )
        if self.change_feed:
            writer = writer.option(CHANGE_FEED_PROPERTY, "true")
        self.target.save(writer)
        fault_point("join_view.written")
        if self.change_feed:
            self.target.keep_change_feed()
        self.context.joined.update(pinned)
        return int(self.target.load(self.target.reader()).count())

    def _by_key_of(self, views: Mapping[str, str]) -> bool:
        """Whether the view holds at most one row per first-table key: every join meets
        its table's whole key, and each pair of joined columns is of one type in the
        tables ``views`` read (where Spark casts one side, two distinct keys of a
        table can meet one row: '1' and '01' both equal 1)."""
        if not self._keyed_joins:
            return False
        spark = self.context.spark
        types = {
            alias: {f.name.lower(): f.dataType for f in spark.table(self._qualified(view)).schema}
            for alias, view in views.items()
        }
        return all(
            types[left.alias].get(left.name.lower()) == types[right.alias].get(right.name.lower())
            for join in self.view.query.joins
            for left, right in join.on
        )

    def _qualified(self, view: str) -> str:
        return f"{quote(self._schema)}.{quote(view)}"

    def _check_unique(self, rows: DataFrame, by_key: bool) -> None:
        """Fail saying a named key is not one where two of the view's ``rows`` have one
        identity, or one first-table key where the view is kept by that key (a MERGE
        refuses two source rows meeting one target row, but inserts both where none is
        there yet)."""
        first_key = [name for alias, _, name in self.view.identity if alias == self.first]
        unique = first_key if by_key else [name for _, _, name in self.view.identity]
        if rows.groupBy(*unique).count().where("count > 1").limit(1).collect():
            raise _not_unique(self.view)

    def _merge(self, target: Any, fresh: DataFrame, keys: DataFrame, by_key: bool) -> int:
        """Replace the target's rows of the first-table ``keys`` with ``fresh``: a row
        whose identity and columns came out the same is left alone, a row no longer
        produced is deleted. ``by_key``: on the first table's key alone (:meth:`_by_key_of`)."""
        fresh = fresh.localCheckpoint()
        self._check_unique(fresh, by_key)
        plan = (self._by_key if by_key else self._by_identity)(target, fresh, keys)
        values: dict[str, str | Column] = {f"`{c}`": F.col(f"s.`{c}`") for c in fresh.columns}
        metrics = (
            target.delta()
            .alias("t")
            .merge(plan.source.alias("s"), plan.matched)
            .whenMatchedDelete(condition=plan.gone)
            .whenMatchedUpdate(
                condition=f"s.{_OP} = 'u' AND ({_differs(plan.compared)})", set=values
            )
            .whenNotMatchedInsert(condition=f"s.{_OP} = 'u'", values=values)
            .execute()
            .first()
        )
        fault_point("join_view.written")
        return 0 if metrics is None else int(metrics["num_affected_rows"])

    def _by_identity(self, target: Any, fresh: DataFrame, keys: DataFrame) -> _MergePlan:
        """The MERGE on the view's identity: ``fresh`` to write, and the target's rows of
        the ``keys`` that it no longer holds, read beforehand, to delete."""
        identity = [name for _, _, name in self.view.identity]
        first_key = [name for alias, _, name in self.view.identity if alias == self.first]
        current = target.load(target.reader())
        on_keys = [
            current[t].eqNullSafe(keys[k])
            for t, k in zip(first_key, self.view.keys[self.first], strict=True)
        ]
        touched = current.join(keys, _all(on_keys), "left_semi")
        gone = touched.join(
            fresh, _all([touched[c].eqNullSafe(fresh[c]) for c in identity]), "left_anti"
        )
        columns = fresh.columns
        source = fresh.withColumn(_OP, F.lit("u")).unionByName(
            gone.select(*columns).withColumn(_OP, F.lit("d"))
        )
        matched = _all([F.col(f"t.`{c}`").eqNullSafe(F.col(f"s.`{c}`")) for c in identity])
        compared = [c for c in columns if c not in identity]
        return _MergePlan(source, matched, f"s.{_OP} = 'd'", compared)

    def _by_key(self, target: Any, fresh: DataFrame, keys: DataFrame) -> _MergePlan:
        """The MERGE where the view holds at most one row per first-table key
        (:meth:`_by_key_of`): each key meets its fresh row, or none
        where the key left the view, and the MERGE matches the target on the key
        alone, so the target is not read beforehand to find the rows that went."""
        del target
        first_key = [name for alias, _, name in self.view.identity if alias == self.first]
        wanted = [keys[k].alias(f"{_KEY}{i}") for i, k in enumerate(self.view.keys[self.first])]
        asked = keys.select(*wanted)
        on = [asked[f"{_KEY}{i}"].eqNullSafe(fresh[c]) for i, c in enumerate(first_key)]
        source = asked.join(fresh.withColumn(_OP, F.lit("u")), _all(on), "left")
        matched = _all(
            [F.col(f"t.`{c}`").eqNullSafe(F.col(f"s.`{_KEY}{i}`")) for i, c in enumerate(first_key)]
        )
        compared = [c for c in fresh.columns if c not in first_key]
        return _MergePlan(source, matched, f"s.{_OP} IS NULL", compared)


@dataclass(frozen=True)
class _MergePlan:
    """What a MERGE of a join view's recomputed rows runs with: its ``source``, the
    ``matched`` condition, when a matched row is deleted (``gone``, SQL), and the
    columns whose difference makes a matched row an update."""

    source: DataFrame
    matched: Column
    gone: str
    compared: list[str]


def _retyped(target: DataFrame, rows: DataFrame) -> list[str]:
    """The columns of ``rows`` the ``target`` lacks or holds at another type."""
    held = {f.name.lower(): f.dataType for f in target.schema}
    return [f.name for f in rows.schema if held.get(f.name.lower()) != f.dataType]


def _differs(columns: list[str]) -> str:
    """SQL: a target row ``t`` differs from its source row ``s`` in one of ``columns``."""
    if not columns:
        return "false"
    return " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in columns)


_UNRESOLVED = ("UNRESOLVED_COLUMN", "FIELD_NOT_FOUND", "DATATYPE_MISMATCH")
"""Spark's refusals of a query whose columns are not what they were (dropped, renamed,
another type)."""


def _not_unique(view: JoinViewOptions) -> PermanentError:
    keys = {alias: list(columns) for alias, columns in view.keys.items()}
    return PermanentError(
        f"join_view: two rows of the view have the same identity, so a key named in the "
        f"option keys ({keys}) is not unique in its table; name each table's primary key "
        "and resync the job",
        ErrorCode.CONSUMER_FAILED,
    )


def _explained(exc: Exception, view: JoinViewOptions) -> Exception:
    """``exc``, or a permanent error saying what to do: where the query no longer
    resolves against the tables (a column it reads was dropped or renamed), or where
    a named key is not one."""
    if isinstance(exc, AnalysisException) and any(m in str(exc) for m in _UNRESOLVED):
        first = str(exc).strip().splitlines()[0][:300]
        return PermanentError(
            f"join_view: the query no longer reads its tables as they are ({first}); "
            "update the job's query to the tables' columns, which resyncs it",
            ErrorCode.SOURCE_SCHEMA_CHANGED,
        )
    if "MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW" not in str(exc):
        return exc
    return _not_unique(view)


def _all(predicates: list[Column]) -> Column:
    result = predicates[0]
    for predicate in predicates[1:]:
        result = result & predicate
    return result
