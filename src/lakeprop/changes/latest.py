"""The last change of every key in a change set: one rule, for Spark and for Arrow.

The engine reads a table's change set once (:mod:`lakeprop.engine.changeset`) and
hands it to every consumer; consumers that keep one row per key apply the last
change of each key, in commit order. The rule, in both engines:

* Within one commit, what the commit leaves (an insert, an update's post-image)
  ranks after what it takes away (a delete, an update's pre-image): an
  overwrite deletes and inserts a key in one commit, and an update that keeps
  its key has both images under it.
* A key whose last change is a pre-image left the table: an update changed a
  key column, so the row went on under another key (its post-image, under the
  new key, is that key's change). Such a pre-image comes out as a ``delete``.
  Nothing pairs the two images (unless row tracking is on), and nothing needs
  to: each key's own last change says what the key holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from lakeprop.changes.feed import CHANGE_TYPE, COMMIT_VERSION, DELETE, INSERT, POSTIMAGE, PREIMAGE

if TYPE_CHECKING:
    import pyarrow as pa

LEAVES = (INSERT, POSTIMAGE)
"""Change types that say what a key holds after the commit."""


def latest_change_per_key(changes: DataFrame, key: list[str]) -> DataFrame:
    """The last change of every key in commit order; a key whose last change is a
    pre-image comes out as a ``delete`` (see the module)."""
    kind = F.col(CHANGE_TYPE)
    rank = F.when(kind.isin(*LEAVES), 1).otherwise(0)
    order = Window.partitionBy(*key).orderBy(F.desc(COMMIT_VERSION), F.desc("_rank"))
    return (
        changes.withColumn("_rank", rank)
        .withColumn("_n", F.row_number().over(order))
        .where(F.col("_n") == 1)
        .drop("_n", "_rank")
        .withColumn(CHANGE_TYPE, F.when(kind == PREIMAGE, F.lit(DELETE)).otherwise(kind))
    )


def latest_change_per_key_arrow(changes: pa.Table, key: Sequence[str]) -> pa.Table:
    """:func:`latest_change_per_key` in Arrow, for the native path."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = changes[CHANGE_TYPE]
    leaves = pc.is_in(kind, value_set=pa.array(LEAVES))
    rows = changes.append_column("_rank", pc.if_else(leaves, 1, 0)).append_column(
        "_row", pa.array(range(changes.num_rows), pa.int64())
    )
    rows = rows.sort_by(
        [(COMMIT_VERSION, "ascending"), ("_rank", "ascending"), ("_row", "ascending")]
    )
    last = (
        rows.append_column("_order", pa.array(range(rows.num_rows), pa.int64()))
        .group_by(list(key), use_threads=False)
        .aggregate([("_order", "max")])
    )
    latest = rows.take(last["_order_max"]).drop_columns(["_rank", "_row"])
    kinds = latest[CHANGE_TYPE]
    gone = pc.if_else(pc.equal(kinds, PREIMAGE), pa.scalar(DELETE), kinds)
    return latest.set_column(latest.schema.get_field_index(CHANGE_TYPE), CHANGE_TYPE, gone)
