"""The job catalog's Delta table: laid out by slot, and written whole or row by row.

One instance writes the rows it changed: appended when the table does not hold
them yet, MERGEd when they are a few of a large table, and otherwise the table
is overwritten whole (:func:`write_kind`). Instances sharing it
(``cluster.enabled``) each MERGE their own rows, signed and stamped
(:meth:`CatalogTable.merge`), into the partitions of the slots they serve: the
table is partitioned by the slot of each row's source table, laid out for the
slot count once per membership topic's era (:meth:`CatalogTable.era`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql.types import IntegerType, StructField, StructType

from lakeprop.errors import InvalidConfigError
from lakeprop.membership.slots import slot_of
from lakeprop.state import store as state
from lakeprop.state.job_row import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.shared import Signed, conflicting, signed_session, with_retries

log = logging.getLogger(__name__)


class RowScope(Enum):
    """Whether an instance sharing the catalog writes a row now (``cluster.enabled``)."""

    WRITE = "write"
    """Its table is served here: write it."""
    DEFER = "defer"
    """Its table is assigned here but not writable this moment: keep it for later."""
    SKIP = "skip"
    """Another instance serves its table and writes it."""


class WriteKind(Enum):
    """How one instance writes its changed rows to the catalog (:func:`write_kind`)."""

    APPEND = "append"
    """Rows the table does not hold: one commit, no read of the table."""
    MERGE = "merge"
    """A few rows of a large table: the table is read and joined once, and only the
    files holding those rows are rewritten."""
    OVERWRITE = "overwrite"
    """The whole table from memory: one write, no read, every row serialized."""


def write_kind(table_rows: int, replaced: int, merge_from: int) -> WriteKind:
    """How one instance writes a change that replaces ``replaced`` rows of a table of
    ``table_rows`` rows (changed or deleted; the rest of the change is rows the table
    does not hold): MERGEd from ``merge_from`` rows (``state.catalog_merge_from``),
    below which serializing every row costs less than the MERGE's read and join."""
    if not replaced:
        return WriteKind.APPEND
    return WriteKind.MERGE if table_rows >= merge_from else WriteKind.OVERWRITE


@dataclass(frozen=True)
class SharedWrites:
    """How an instance writes its rows of a catalog that several instances share:
    which rows (``scope``), stamped how (``owner``), signed how (``sign``)."""

    scope: Callable[[CatalogRow], RowScope]
    owner: Callable[[CatalogRow], str]
    sign: Callable[[], Signed]


KEY_COLUMNS = ("account_id", "database", "table", "job_name", "job_id")
ERA_PROPERTY = "lakeprop.cluster.era"
MEMBERSHIP_PROPERTY = "lakeprop.cluster.membership"
"""The catalog's properties: the membership topic's era, and the topic it counts for."""
SLOT = "slot"
TABLE_SCHEMA = StructType([*CATALOG_SCHEMA.fields, StructField(SLOT, IntegerType(), False)])
"""The catalog table: the rows and, as its partition column, the slot of each row's
source table under the table's layout (so instances serving different slots write
different partitions, and their MERGEs never conflict)."""
LAYOUT_PROPERTY = "lakeprop.catalog.slots"
"""The table property naming the slot count its partitions are laid out for."""
LAYOUT_APP_ID = "lakeprop.catalog.layout"
"""The Delta transaction id of a re-layout for a shared catalog, at its membership
era: of instances starting together on a new topic one lays the table out, and
Delta skips the others' re-layouts as done."""
_EPOCH = "coalesce(try_cast(substring_index({0}.owner, '@', -1) AS BIGINT), -1)"
NOT_OLDER = f"{_EPOCH.format('t')} <= {_EPOCH.format('s')}"
"""A shared-catalog write replaces no row written under a larger epoch."""


class CatalogTable:
    """The catalog's Delta table, as one instance or a shared catalog writes it."""

    def __init__(
        self, spark: SparkSession, path: str, shared: SharedWrites | None, slots: int | None
    ) -> None:
        self.spark = spark
        self.path = path
        self.shared = shared
        self.slots = slots
        """The layout a shared catalog needs (``cluster.slots``); None: one instance,
        which keeps the layout the table has."""
        self.layout = slots or 1
        """The slot count the table is laid out for (:data:`LAYOUT_PROPERTY`)."""
        self._laid_out = shared is None
        """Whether :attr:`layout` is the table's (a shared catalog learns it in :meth:`era`)."""
        self._session = spark.newSession() if shared is not None else spark
        """Where shared writes set their transaction confs (writes are serialized)."""

    def ensure(self) -> bool:
        """Create the table if it is missing; whether this call created it."""
        return state.ensure_table(
            self.spark,
            self.path,
            TABLE_SCHEMA,
            {LAYOUT_PROPERTY: str(self.layout)},
            partitioned_by=(SLOT,),
        )

    def read(self) -> list[CatalogRow]:
        """Every row, as the table holds it now."""
        return [CatalogRow.from_spark(r) for r in state.read_table(self.spark, self.path).collect()]

    def keep_layout(self) -> None:
        """One instance keeps the layout the table has, and lays a table of an earlier
        release (not partitioned) out for one slot."""
        found = self._found_layout()
        if found is None:
            self._lay_out(1, None)
        else:
            self.layout = found

    def append(self, rows: Iterable[CatalogRow]) -> None:
        """Add ``rows``, which the table does not hold, in one commit (one instance)."""
        state.append(
            self.spark, self.path, TABLE_SCHEMA, [self._stored(r, self.layout) for r in rows]
        )

    def overwrite(self, rows: Iterable[CatalogRow]) -> None:
        """Replace the table's content with ``rows`` in one commit (one instance)."""
        state.overwrite(
            self.spark,
            self.path,
            TABLE_SCHEMA,
            [self._stored(r, self.layout) for r in rows],
            partitioned_by=(SLOT,),
        )

    def _found_layout(self) -> int | None:
        """The slot count the table is partitioned for; None for a table of an earlier
        release (not partitioned by slot)."""
        from delta.tables import DeltaTable

        detail = DeltaTable.forPath(self.spark, self.path).detail().first()
        if detail is None or list(detail["partitionColumns"] or []) != [SLOT]:
            return None
        recorded = dict(detail["properties"] or {}).get(LAYOUT_PROPERTY)
        return None if recorded is None else int(recorded)

    def _stored(self, row: CatalogRow, layout: int) -> tuple[Any, ...]:
        """``row`` as the table holds it: its columns and its slot under ``layout``."""
        return (*row.as_tuple(), slot_of(row.database, row.table, layout))

    def _lay_out(self, slots: int, era: int | None) -> None:
        """Rewrite the table partitioned for ``slots``, rows unchanged, and record the
        layout. A shared catalog's re-layout carries :data:`LAYOUT_APP_ID` at ``era``,
        so of instances starting together on a new membership topic one rewrites it
        and Delta skips the rest; the rows' slots are then checked, not trusted."""
        rows = self.read()
        frame = self.spark.createDataFrame([self._stored(r, slots) for r in rows], TABLE_SCHEMA)
        writer = (
            frame.coalesce(1)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .partitionBy(SLOT)
        )
        if era is not None:
            writer = writer.options(txnAppId=LAYOUT_APP_ID, txnVersion=str(era))
        with_retries(
            f"catalog layout of {self.path}",
            partial(writer.save, self.path),
            table="catalog_layout",
        )
        placed = state.read_table(self.spark, self.path).select("database", "table", SLOT)
        misplaced = [
            f"{r['database']}.{r['table']}"
            for r in placed.distinct().collect()
            if r[SLOT] != slot_of(r["database"], r["table"], slots)
        ]
        if misplaced:
            raise InvalidConfigError(
                f"the catalog {self.path} is laid out for another slot count in this membership "
                f"topic's era ({len(misplaced)} table(s), {misplaced[0]} first), not for "
                f"cluster.slots = {slots}: a new slot count needs a new cluster.topic "
                "(the scale-out docs, 'Choosing the slots')"
            )
        alter = (
            f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ('{LAYOUT_PROPERTY}' = '{slots}')"
        )
        with_retries(
            f"catalog layout of {self.path}", partial(self.spark.sql, alter), table="catalog_layout"
        )
        self.layout = slots
        log.info("catalog %s laid out for %d slot(s)", self.path, slots)

    def merge(self, rows: Iterable[CatalogRow], deleted: Iterable[CatalogRow]) -> None:
        """Upsert ``rows`` and delete ``deleted`` in one MERGE: signed and stamped, and
        replacing no row of a later epoch, where the catalog is shared."""
        from delta.tables import DeltaTable
        from pyspark.sql.types import BooleanType

        shared = self.shared
        stamped = [
            (
                *self._stored(
                    r if shared is None else replace(r, owner=shared.owner(r)), self.layout
                ),
                gone,
            )
            for batch, gone in ((rows, False), (deleted, True))
            for r in batch
        ]
        if not stamped:
            return
        if not self._laid_out:
            raise AssertionError("a shared catalog is written before its layout is known")
        signed = shared.sign() if shared is not None else None
        newer = "" if shared is None else f" AND {NOT_OLDER}"
        session = self._session
        source_schema = StructType([*TABLE_SCHEMA.fields, StructField("_lp_gone", BooleanType())])
        columns: dict[str, str | Column] = {
            f"`{f.name}`": f"s.`{f.name}`" for f in TABLE_SCHEMA.fields
        }
        # the partitions of these rows' slots only: other instances' writes do not conflict
        slots = ", ".join(str(s) for s in sorted({row[-2] for row in stamped}))
        on = " AND ".join(
            [f"t.`{SLOT}` IN ({slots})", *(f"t.`{k}` = s.`{k}`" for k in (SLOT, *KEY_COLUMNS))]
        )

        def merge() -> None:
            source = session.createDataFrame(stamped, source_schema)
            with signed_session(session, signed) if signed is not None else nullcontext():
                (
                    DeltaTable.forPath(session, self.path)
                    .alias("t")
                    .merge(source.alias("s"), on)
                    .whenMatchedDelete(condition=f"s._lp_gone{newer}")
                    .whenMatchedUpdate(condition=f"NOT s._lp_gone{newer}", set=columns)
                    .whenNotMatchedInsert(condition="NOT s._lp_gone", values=columns)
                    .execute()
                )

        with_retries(f"catalog write to {self.path}", merge, table="catalog")

    def era(self, identity: str) -> int:
        """The era of the membership topic ``identity`` (``cluster.enabled``), with the
        table laid out for :attr:`slots` before anything of this instance is written."""
        era = self._era(identity)
        if not self._laid_out:
            assert self.slots is not None
            found = self._found_layout()
            if found == self.slots:
                self.layout = found
            else:
                self._lay_out(self.slots, era)
            self._laid_out = True
        return era

    def _era(self, identity: str, attempts: int = 8) -> int:
        """The era of ``identity``: the one the catalog's properties hold for it, or one
        above theirs for a topic they do not name (recorded at once; of instances
        starting together, Delta lets one record it and the others read it)."""
        from delta.tables import DeltaTable

        for attempt in range(attempts):
            detail = DeltaTable.forPath(self.spark, self.path).detail().first()
            properties = {} if detail is None else dict(detail["properties"] or {})
            era = int(properties.get(ERA_PROPERTY, "0"))
            if properties.get(MEMBERSHIP_PROPERTY) == identity:
                return era
            try:
                self.spark.sql(
                    f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES "
                    f"('{ERA_PROPERTY}' = '{era + 1}', '{MEMBERSHIP_PROPERTY}' = '{identity}')"
                )
            except Exception as exc:
                if not conflicting(exc) or attempt == attempts - 1:
                    raise
                continue
            log.info(
                "membership topic %s starts era %d of catalog %s", identity, era + 1, self.path
            )
            return era + 1
        raise AssertionError("unreachable")
