"""``aggregate_view``: an incrementally maintained aggregate of one source table.

Options::

    {"group_by": ["region"],                                  # zero or more columns
     "aggregates": [{"fn": "count", "as": "orders"},          # count(*)
                    {"fn": "count", "column": "amount", "as": "priced"},
                    {"fn": "sum", "column": "amount", "as": "revenue"},
                    {"fn": "avg", "column": "amount", "as": "mean"},
                    {"fn": "min", "column": "amount", "as": "low"},
                    {"fn": "max", "column": "amount", "as": "high"}],
     "target_database": "...", "target_table": "..."}         # optional

The view table has the ``group_by`` columns and one column per aggregate,
equal at every watermark to ``SELECT group_by, aggregates FROM source GROUP BY
group_by`` at that version, plus bookkeeping columns prefixed ``_lp_`` (row
and non-null counts, sums). Count and sum move by deltas of the changes (an
update counts as its pre-image removed and post-image added). Min and max take
the least/greatest of the old extreme and the inserted values; a group is
recomputed from the source at the iteration's version (from the rows its
``drop`` rules keep) when a value at or beyond that merged extreme was deleted
or updated away in the range (it may be the old extreme, or a value inserted
and removed again within the range). A
group whose last row goes is deleted; without ``group_by`` the view is one row,
as the SQL query is, also when the source is empty.

Deltas must not be applied twice: the view's Delta log records, in the same
commit as each MERGE, the version this job applied up to, and changes at or
below it are skipped, so an overlapping range after a crash adds nothing.
Sums of floating-point columns accumulate rounding like any running sum.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from lakeprop.changes.held import release
from lakeprop.consumers import aggregate_rows, native
from lakeprop.consumers.aggregate_rows import ROWS
from lakeprop.consumers.base import Consumer, ConsumerContext
from lakeprop.consumers.options import TARGET_OPTIONS, reject_unknown_options, target_options
from lakeprop.errors import InvalidConsumerOptionsError, InvalidIdentifierError
from lakeprop.identifiers import validate_identifier

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

_ALLOWED = {"group_by", "aggregates", *TARGET_OPTIONS}
_FUNCTIONS = {"count", "sum", "avg", "min", "max"}
_INTEGRAL = {"byte", "short", "integer", "long"}
_FLOATING = {"float", "double"}
NATIVE_VIEW_ROWS = 1_000_000
"""The most rows a view may hold for its tails to take the native path."""
RECOMPUTE_ROWS = 1_000_000
"""The most source rows over which a view with a minimum or maximum takes the native
path: recomputing an extreme there reads the group's rows into the driver."""
_COLLATIONS = "__COLLATIONS"
"""The field metadata in which Delta keeps a string column's collation."""
_sum_col, _count_col = aggregate_rows.sum_column, aggregate_rows.count_column


def _null_safe(keys: list[str], left: str, right: str) -> Column:
    if not keys:
        return F.lit(True)
    return reduce(
        lambda a, b: a & b,
        [F.col(f"{left}.{k}").eqNullSafe(F.col(f"{right}.{k}")) for k in keys],
    )


class AggregateViewConsumer(Consumer):
    """GROUP BY aggregates kept by deltas, MERGEd per range."""

    native = True

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        reject_unknown_options("aggregate_view", options, _ALLOWED)
        try:
            group_by = options.get("group_by") or []
            if not isinstance(group_by, list):
                raise InvalidConsumerOptionsError("aggregate_view option group_by must be a list")
            group_by = [validate_identifier(c, "aggregate_view group_by column") for c in group_by]
            aggregates = options.get("aggregates")
            if not isinstance(aggregates, list) or not aggregates:
                raise InvalidConsumerOptionsError(
                    "aggregate_view option aggregates must be a non-empty list"
                )
            out_aggs = []
            for agg in aggregates:
                if not isinstance(agg, dict) or set(agg) - {"fn", "column", "as"}:
                    raise InvalidConsumerOptionsError(
                        f"each aggregate is {{'fn', 'column', 'as'}}, got {agg!r}"
                    )
                fn = agg.get("fn")
                if fn not in _FUNCTIONS:
                    raise InvalidConsumerOptionsError(
                        f"aggregate fn must be one of {sorted(_FUNCTIONS)}, got {fn!r}"
                    )
                column = agg.get("column")
                if column is None and fn != "count":
                    raise InvalidConsumerOptionsError(f"aggregate {fn} needs a column")
                alias = validate_identifier(agg.get("as"), "aggregate alias")
                if alias.startswith("_lp_"):
                    raise InvalidConsumerOptionsError(f"aggregate alias {alias!r} is reserved")
                out_aggs.append(
                    {
                        "fn": fn,
                        "column": None if column is None else validate_identifier(column, "column"),
                        "as": alias,
                    }
                )
            names = [c.lower() for c in group_by] + [a["as"].lower() for a in out_aggs]
            if len(set(names)) != len(names):
                raise InvalidConsumerOptionsError("aggregate_view column names must be distinct")
            result: dict[str, Any] = {"group_by": group_by, "aggregates": out_aggs}
            result.update(target_options(options))
        except InvalidIdentifierError as exc:
            raise InvalidConsumerOptionsError(f"aggregate_view: {exc}") from None
        return result

    @classmethod
    def source_columns(cls, options: Mapping[str, Any]) -> list[str]:
        columns = list(options["group_by"])
        columns += [a["column"] for a in options["aggregates"] if a["column"] is not None]
        return list(dict.fromkeys(columns))

    def __init__(self, context: ConsumerContext) -> None:
        super().__init__(context)
        self.group_by: list[str] = list(context.options["group_by"])
        self.aggregates: list[dict[str, Any]] = list(context.options["aggregates"])

    def _summed(self) -> list[dict[str, Any]]:
        """Aggregates kept as (sum, non-null count): sum, avg, count(column)."""
        return [a for a in self.aggregates if a["fn"] in ("sum", "avg", "count") and a["column"]]

    def _outputs(self, prefix: str = "") -> list[Column]:
        """Public columns from bookkeeping columns (of the frame aliased ``prefix``)."""
        p = f"{prefix}." if prefix else ""
        columns = []
        for a in self.aggregates:
            alias, fn = a["as"], a["fn"]
            n, s = F.col(p + _count_col(alias)), F.col(p + _sum_col(alias))
            if fn == "count":
                value = F.col(p + ROWS) if a["column"] is None else n
            elif fn == "sum":
                value = F.when(n > 0, s)
            elif fn == "avg":
                value = F.when(n > 0, s / n)
            else:
                value = F.col(p + alias)
            columns.append(value.alias(alias))
        return columns

    def _bookkeeping(self) -> list[str]:
        names = [ROWS]
        for a in self._summed():
            names += [_sum_col(a["as"]), _count_col(a["as"])]
        return names

    def snapshot(self, rows: DataFrame, version: int) -> int:
        aggs = [F.count(F.lit(1)).alias(ROWS)]
        for a in self.aggregates:
            column = a["column"]
            if a in self._summed():
                aggs += [
                    F.sum(column).alias(_sum_col(a["as"])),
                    F.count(column).alias(_count_col(a["as"])),
                ]
            elif a["fn"] in ("min", "max"):
                aggs.append(getattr(F, a["fn"])(column).alias(a["as"]))
        grouped = rows.groupBy(*self.group_by).agg(*aggs) if self.group_by else rows.agg(*aggs)
        view = self._shape(grouped)
        self.overwrite(view, version)
        return int(view.count())

    def _shape(self, frame: DataFrame) -> DataFrame:
        """group_by, public aggregates, then bookkeeping columns."""
        extremes = {a["as"] for a in self.aggregates if a["fn"] in ("min", "max")}
        public = [
            F.col(a["as"]) if a["as"] in extremes else out
            for a, out in zip(self.aggregates, self._outputs(), strict=True)
        ]
        return frame.select(*self.group_by, *public, *self._bookkeeping())

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        self.require_target()
        applied = self.applied_version()
        if applied is not None and applied >= to_version:
            return 0
        rows = self.context.change_rows  # the rows handed over, when the engine counted them
        if applied is not None and applied > from_version:
            changes = changes.where(F.col("_commit_version") > applied)
            rows = None
        if rows == 0:
            return 0
        kind = F.col("_change_type")
        sign = F.when(kind.isin("insert", "update_postimage"), 1).otherwise(-1)
        signed = changes.withColumn("_lp_sign", sign)
        deltas = [F.sum("_lp_sign").alias("_d_rows")]
        for a in self.aggregates:
            alias, column = a["as"], a["column"]
            if a in self._summed():
                deltas += [
                    F.sum(F.col("_lp_sign") * F.coalesce(F.col(column), F.lit(0))).alias(
                        f"_d_sum_{alias}"
                    ),
                    F.sum(F.col("_lp_sign") * F.col(column).isNotNull().cast("int")).alias(
                        f"_d_n_{alias}"
                    ),
                ]
            elif a["fn"] in ("min", "max"):
                pick = getattr(F, a["fn"])
                deltas += [
                    pick(F.when(F.col("_lp_sign") == 1, F.col(column))).alias(f"_ins_{alias}"),
                    pick(F.when(F.col("_lp_sign") == -1, F.col(column))).alias(f"_rm_{alias}"),
                ]
        delta = (
            signed.groupBy(*self.group_by).agg(*deltas) if self.group_by else signed.agg(*deltas)
        ).persist()
        try:
            # a change row gives its group a count: uncounted rows are looked for
            if rows is None and delta.where(F.col("_d_rows").isNotNull()).limit(1).count() == 0:
                return 0
            return self._merge(delta, to_version)
        finally:
            delta.unpersist()

    def _merge(self, delta: DataFrame, to_version: int) -> int:
        view = self.target.delta().toDF()
        joined = delta.alias("d").join(view.alias("v"), _null_safe(self.group_by, "d", "v"), "left")
        extremes = [a for a in self.aggregates if a["fn"] in ("min", "max")]
        recompute = F.lit(False)
        for a in extremes:
            removed = F.col(f"d._rm_{a['as']}")
            candidate = self._candidate(a)
            # The candidate (old extreme merged with the inserted values) stays
            # exact unless a value at or beyond it went away in the range: that
            # may be the old extreme, or a value inserted and removed again.
            gone = removed <= candidate if a["fn"] == "min" else removed >= candidate
            recompute = recompute | (removed.isNotNull() & (candidate.isNull() | gone))
        columns = [F.col(f"d.{g}").alias(g) for g in self.group_by]
        columns.append((F.coalesce(F.col(f"v.{ROWS}"), F.lit(0)) + F.col("d._d_rows")).alias(ROWS))
        for a in self._summed():
            alias = a["as"]
            columns += [
                (
                    F.coalesce(F.col(f"v.{_sum_col(alias)}"), F.lit(0)) + F.col(f"d._d_sum_{alias}")
                ).alias(_sum_col(alias)),
                (
                    F.coalesce(F.col(f"v.{_count_col(alias)}"), F.lit(0)) + F.col(f"d._d_n_{alias}")
                ).alias(_count_col(alias)),
            ]
        columns += [self._candidate(a).alias(a["as"]) for a in extremes]
        columns.append(recompute.alias("_lp_recompute"))
        updated = joined.select(*columns)
        if not extremes:  # not held: the MERGE materialises its source once itself
            return self._write(self._shape(updated), to_version)
        # held: the groups to recompute are counted as it is stored, and with none
        # (a figure of 0, not a missing one) the MERGE reads it without Delta
        # copying it first; a MERGE whose source also recomputes groups from the
        # source table lets Delta copy it, so that read runs once
        flagged = Observation("aggregate_view recompute")
        updated = updated.observe(
            flagged, F.sum(F.col("_lp_recompute").cast("int")).alias("groups")
        ).localCheckpoint()
        try:
            if flagged.get.get("groups") == 0:
                with self.context.merging_held():
                    return self._write(self._shape(updated), to_version)
            exact = self._recompute_extremes(updated, extremes, to_version)
            return self._write(self._shape(exact), to_version)
        finally:
            release(updated)

    @staticmethod
    def _candidate(aggregate: Mapping[str, Any]) -> Column:
        """The view's extreme merged with the range's inserted values (nulls ignored)."""
        merge = F.least if aggregate["fn"] == "min" else F.greatest
        alias = aggregate["as"]
        return merge(F.col(f"v.{alias}"), F.col(f"d._ins_{alias}"))

    def _write(self, shaped: DataFrame, to_version: int) -> int:
        """The groups' new rows merged into the view; the view rows it wrote."""
        on = _null_safe(self.group_by, "t", "s")
        assignments: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in shaped.columns}
        merge = self.target.delta().alias("t").merge(shaped.alias("s"), on)
        if self.group_by:  # a group whose last row went is no group any more
            merge = (
                merge.whenMatchedDelete(condition=F.col(f"s.{ROWS}") <= 0)
                .whenMatchedUpdate(set=assignments)
                .whenNotMatchedInsert(condition=F.col(f"s.{ROWS}") > 0, values=assignments)
            )
        else:  # without GROUP BY there is one row, over no rows too (count 0, the rest null)
            merge = merge.whenMatchedUpdate(set=assignments).whenNotMatchedInsert(
                values=assignments
            )
        with self.context.idempotent(to_version):
            metrics = merge.execute().first()
        return 0 if metrics is None else int(metrics["num_affected_rows"])

    def _recompute_extremes(
        self, updated: DataFrame, extremes: list[dict[str, Any]], to_version: int
    ) -> DataFrame:
        """Min/max from the source at ``to_version`` for the flagged groups only."""
        key = self.context.key
        source = self.context.locate(key.database, key.table)
        rows = source.load(source.reader().option("versionAsOf", to_version))
        if self.context.keeps:  # the rows the view holds: those its drop rules keep
            rows = rows.where(self.context.keeps)
        flagged = updated.where("_lp_recompute").select(*self.group_by)
        if self.group_by:
            rows = rows.join(
                flagged.alias("f"),
                [rows[g].eqNullSafe(F.col(f"f.{g}")) for g in self.group_by],
                "left_semi",
            )
        exact = [getattr(F, a["fn"])(a["column"]).alias(f"_x_{a['as']}") for a in extremes]
        fresh = rows.groupBy(*self.group_by).agg(*exact) if self.group_by else rows.agg(*exact)
        joined = updated.alias("u").join(
            fresh.alias("x"), _null_safe(self.group_by, "u", "x"), "left"
        )
        replaced = [
            F.when(F.col("u._lp_recompute"), F.col(f"x._x_{a['as']}"))
            .otherwise(F.col(f"u.{a['as']}"))
            .alias(a["as"])
            for a in extremes
        ]
        names = {a["as"] for a in extremes}
        kept = [F.col(f"u.{c}") for c in updated.columns if c not in names]
        return joined.select(*kept, *replaced)

    # -- the native path ---------------------------------------------------------------

    def written_columns(self) -> list[str]:
        return [*self.group_by, *(a["as"] for a in self.aggregates), *self._bookkeeping()]

    def why_not_native(self, fields: Sequence[tuple[str, Any]]) -> str | None:
        """Columns whose values Python groups, sums or orders otherwise than Spark stay
        on Spark: a floating-point group column (Spark groups its NaN and -0.0), a
        sum, average or count of anything but integers and floats (decimals round as
        Spark types them; a count keeps a sum), a floating-point extreme, a nested
        column, a collated string, a timestamp partition column. So does a view with
        extremes over a source with deletion vectors (whose rows a recompute reads,
        and delta-rs does not) or of more than :data:`RECOMPUTE_ROWS` rows."""
        used = [(g, "group") for g in self.group_by]
        used += [(a["column"], a["fn"]) for a in self.aggregates if a["column"] is not None]
        refused = columns_refused(used, dict(fields))
        if refused is not None:
            return refused
        return self._why_not_native_source({c for c, _ in used}) or self._why_not_native_view()

    def _why_not_native_view(self) -> str | None:
        """A view of more than :data:`NATIVE_VIEW_ROWS` rows (by its files' counts)
        stays on Spark: a tail reads the rows of its groups into the driver, and
        perhaps every row (where the group filter cannot use the files' statistics)."""
        import pyarrow as pa

        table = native.open_table(self.target.location(), self.context.storage)
        files = pa.table(table.get_add_actions(flatten=True))
        counts = files.column("num_records").to_pylist() if files.num_rows else []
        if any(c is None for c in counts) or sum(counts) > NATIVE_VIEW_ROWS:
            return f"the view has more than {NATIVE_VIEW_ROWS} rows (or uncounted ones)"
        return None

    def _why_not_native_source(self, named: set[str]) -> str | None:
        """What of the source keeps a tail on Spark (:meth:`why_not_native`)."""
        import pyarrow as pa

        key = self.context.key
        source = self.context.locate(key.database, key.table)
        table = native.open_table(source.location(), self.context.storage)
        collated = [
            f.name for f in table.schema().fields if f.name in named and f.metadata.get(_COLLATIONS)
        ]
        if collated:
            return f"column(s) {collated} have a collation"
        stamped = [
            f.name
            for f in table.schema().fields
            if f.name in named
            and f.name in table.metadata().partition_columns
            and getattr(f.type, "type", "") in ("timestamp", "timestamp_ntz")
        ]
        if stamped:  # a partition value without a zone: delta-rs reads it as UTC
            return f"the source is partitioned by timestamp column(s) {stamped}"
        if self._extremes():  # a recomputed extreme reads the group's rows in the driver
            reader, _ = native.features(table)
            if "deletionVectors" in reader:
                return "the source has deletion vectors, which a recompute of an extreme reads"
            files = pa.table(table.get_add_actions(flatten=True))
            counts = files.column("num_records").to_pylist() if files.num_rows else []
            if any(c is None for c in counts) or sum(counts) > RECOMPUTE_ROWS:
                return (
                    f"a minimum or maximum over a source of more than {RECOMPUTE_ROWS} rows "
                    "(or uncounted ones) is recomputed on Spark"
                )
        return None

    def apply_changes_native(self, changes: pa.Table, from_version: int, to_version: int) -> int:
        """The same change of the view with delta-rs, in the driver: the groups' deltas
        and new rows in Python (:mod:`~lakeprop.consumers.aggregate_rows`), a
        recomputed extreme read from the source at ``to_version``, then one MERGE
        carrying the job's transaction; the changes it applied already (a replay
        after a crash) are skipped, as on Spark."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import CommitProperties, Transaction

        target = self.require_target()
        table = native.open_table(target.location(), self.context.storage)
        applied = table.transaction_version(self.context.txn_app_id)
        if applied is not None and applied >= to_version:
            return 0  # written before a crash: the watermark catches up
        if applied is not None and applied > from_version:
            changes = changes.filter(pc.greater(changes["_commit_version"], applied))
        if changes.num_rows == 0:
            return 0
        written = self.written_columns()
        native.check_columns(table, written)
        shape = self._arithmetic()
        read = [*dict.fromkeys([*self.group_by, *self.source_columns(self.context.options)])]
        moved = aggregate_rows.deltas(shape, changes.select([*read, "_change_type"]).to_pylist())
        schema = pa.schema(table.schema().to_arrow())
        current = self._current(table, schema, list(moved))
        new: dict[aggregate_rows.Group, dict[str, Any]] = {}
        flagged = []
        for group, delta in moved.items():
            row, recompute = aggregate_rows.moved(shape, group, delta, current.get(group))
            new[group] = row
            if recompute and (not self.group_by or row[ROWS] > 0):  # else it goes
                flagged.append(group)
        if flagged:
            for group, exact in self._source_extremes(shape, flagged, to_version).items():
                new[group].update(exact)
        data = pa.Table.from_pylist(list(new.values()), schema=schema).select(written)
        # each conjunct in parentheses: delta-rs reads ``a IS NOT DISTINCT FROM b AND
        # ...`` as ``a IS NOT DISTINCT FROM (b AND ...)``
        on = " AND ".join(
            f"(t.{native.quoted(g)} IS NOT DISTINCT FROM s.{native.quoted(g)})"
            for g in self.group_by
        )
        values = {native.quoted(c): f"s.{native.quoted(c)}" for c in written}
        merge = table.merge(
            data,
            on or "TRUE",
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self.context.txn_app_id, to_version)]
            ),
        )
        if self.group_by:  # a group whose last row went is no group any more
            merge = (
                merge.when_matched_delete(f"s.{ROWS} <= 0")
                .when_matched_update(values)
                .when_not_matched_insert(values, f"s.{ROWS} > 0")
            )
        else:  # one row, over no rows too
            merge = merge.when_matched_update(values).when_not_matched_insert(values)
        return native.rows_changed(merge.execute())

    def _extremes(self) -> list[dict[str, Any]]:
        return [a for a in self.aggregates if a["fn"] in ("min", "max")]

    def _arithmetic(self) -> aggregate_rows.Shape:
        return aggregate_rows.Shape(tuple(self.group_by), tuple(self.aggregates))

    def _current(
        self, table: DeltaTable, schema: pa.Schema, groups: list[aggregate_rows.Group]
    ) -> dict[aggregate_rows.Group, dict[str, Any]]:
        """The view's rows of ``groups``, by group (read with a filter on the group
        columns, then matched exactly)."""
        found = _filtered(table, None, self._of_groups(schema, groups))
        return {tuple(r[g] for g in self.group_by): r for r in native.plain(found).to_pylist()}

    def _of_groups(self, schema: pa.Schema, groups: list[aggregate_rows.Group]) -> Any:
        """A filter that keeps the rows of ``groups`` (and perhaps a few more: each
        column's values are matched apart); None without ``group_by``."""
        import pyarrow as pa
        import pyarrow.compute as pc

        condition = None
        for i, column in enumerate(self.group_by):
            values = {group[i] for group in groups}
            present = [v for v in values if v is not None]
            field = pc.field(column)
            kept = field.isin(pa.array(present, type=schema.field(column).type))
            if None in values:
                kept = kept | field.is_null()
            condition = kept if condition is None else condition & kept
        return condition

    def _source_extremes(
        self, shape: aggregate_rows.Shape, groups: list[aggregate_rows.Group], version: int
    ) -> dict[aggregate_rows.Group, dict[str, Any]]:
        """Each extreme of ``groups`` over the source's rows at ``version``, read with
        delta-rs (no rules apply: a job with rules runs on Spark), folded per group with
        Arrow."""
        import pyarrow as pa

        key = self.context.key
        source = native.open_table(
            self.context.locate(key.database, key.table).location(), self.context.storage
        )
        source.load_as_version(version)
        schema = pa.schema(source.schema().to_arrow())
        columns = [*dict.fromkeys([*self.group_by, *(a["column"] for a in self._extremes())])]
        found = native.plain(_filtered(source, columns, self._of_groups(schema, groups)))
        per_group = fold_extremes(found, self.group_by, self._extremes())
        return aggregate_rows.extremes_of(shape, per_group, groups, named=True)


def _filtered(table: DeltaTable, columns: list[str] | None, condition: Any) -> pa.Table:
    """``table``'s rows that may meet ``condition`` (None: every row): with the filter
    pushed down to its files where pyarrow can compare the files' statistics with it
    (it fails on some string columns of files delta-rs wrote, whose statistics come
    as another string type), else every row (the caller matches each one exactly)."""
    import pyarrow as pa

    if condition is not None:
        try:
            return table.to_pyarrow_table(columns=columns, filters=condition)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            log.info("%s read whole, its filter fails on its statistics: %s", table, exc)
    return table.to_pyarrow_table(columns=columns)


def columns_refused(used: Sequence[tuple[str, str]], kinds: Mapping[str, Any]) -> str | None:
    """Why a view's columns (name, role: ``group`` or the aggregate's function) keep
    its tails on Spark, by their delta-rs types ``kinds`` (by name); None when none
    does (:meth:`AggregateViewConsumer.why_not_native`)."""
    from deltalake.schema import PrimitiveType

    for column, role in used:
        kind = kinds.get(column)
        if kind is None:
            return f"column {column!r} is named otherwise in the source"
        if not isinstance(kind, PrimitiveType):
            return f"column {column} is of a nested type"
        name = kind.type
        if role == "group" and name in _FLOATING:
            return f"group column {column} is of type {name}"
        if role in ("sum", "avg", "count") and name not in _INTEGRAL | _FLOATING:
            # a count of a column keeps its sum too (the view's bookkeeping)
            return f"{role}({column}) of type {name} is typed by Spark's rules"
        if role in ("min", "max") and name in _FLOATING:
            return f"{role}({column}) of type {name} orders NaN as Spark does"
    return None


def fold_extremes(
    rows: pa.Table, group_by: Sequence[str], extremes: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per group of ``rows`` (every row, without ``group_by``), each extreme under its
    alias, folded with Arrow: NULLs group together, strings order by their bytes, as
    Spark's do. The columns are folded under names of their own, since Arrow names
    an aggregate ``<input>_<fn>``, which a group column may be called too."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pairs = list(dict.fromkeys((a["column"], a["fn"]) for a in extremes))
    inputs = pa.table(
        {
            **{f"_lp_g{i}": rows[g] for i, g in enumerate(group_by)},
            **{f"_lp_x{j}": rows[c] for j, (c, _) in enumerate(pairs)},
        }
    )
    slot = {pair: f"_lp_x{j}_{pair[1]}" for j, pair in enumerate(pairs)}
    if group_by:
        keys = [f"_lp_g{i}" for i in range(len(group_by))]
        aggregates = [(f"_lp_x{j}", fn) for j, (_, fn) in enumerate(pairs)]
        folded = inputs.group_by(keys).aggregate(aggregates).to_pylist()
    else:
        folded = [
            {slot[p]: getattr(pc, p[1])(inputs[f"_lp_x{j}"]).as_py() for j, p in enumerate(pairs)}
        ]
    return [
        {
            **{g: row[f"_lp_g{i}"] for i, g in enumerate(group_by)},
            **{a["as"]: row[slot[(a["column"], a["fn"])]] for a in extremes},
        }
        for row in folded
    ]
