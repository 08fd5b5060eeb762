"""``vector_index``: an IVF index of a vector column, kept as Delta tables.

Options::

    {"key": ["id"],                    # required: the source's key
     "vector": "embedding",            # required: array<float> or array<double>
     "metric": "l2",                   # l2 (default), cosine or inner_product
     "lists": 316,                     # optional: rows/1,000 up to 1M rows, sqrt(rows) above
     "nprobe": 18,                     # optional: default search width, sqrt(lists), >= 4
     "include": ["category", "title"], # optional: columns kept for filters and results
     "dimension": 128,                 # optional: else the snapshot's most common one
     "quarantine": false,              # bad vectors to <target>__quarantine, not an error
     "retrain": {"max_imbalance": 5.0, "max_empty_share": 0.25,
                 "max_changed_share": 0.5, "min_recall": 0.9,
                 "recall_check_every": 10, "enabled": true},
     "target_database": "search", "target_table": "docs_vectors"}

Three Delta tables hold the index:

* ``<target>``, the postings: ``index_version``, ``list_id``, the key, the
  vector as ``vector_bytes`` (its ``float32`` values, little-endian, unit
  length for ``cosine``; see :mod:`.ivf` for the ``array`` encoding of older
  versions) and the included columns, **partitioned by**
  ``(index_version, list_id)``. A search reads the
  files of the lists it probes and no others, pruned from the Delta log by
  partition values alone; clustering would leave file boundaries to OPTIMIZE
  and mix lists in a file.
* ``<target>__centroids``: ``index_version``, ``list_id``, ``centroid``.
* ``<target>__index``: one row per kept index version, with its shape, its
  drift measures and ``live``; the live row is the pointer a reader follows.

How a snapshot, a tail and a re-training write them is in :mod:`.consumer`;
the background builds are in :mod:`.builds`, the tables and their versions in
:mod:`.versions`, the IVF arithmetic in :mod:`.ivf`.

A NULL vector means "not indexed". A vector of the wrong dimension or holding
a NaN, infinity or NULL element is a permanent error naming keys; with
``quarantine`` such rows go to ``<target>__quarantine`` with the reason instead
(and their key leaves the index).
"""

from __future__ import annotations

from lakeprop.consumers.vector_index import ivf
from lakeprop.consumers.vector_index.builds import MAX_SAMPLE, SAMPLE_PER_LIST
from lakeprop.consumers.vector_index.consumer import VectorError, VectorIndexConsumer
from lakeprop.consumers.vector_index.ivf import vector_array
from lakeprop.consumers.vector_index.versions import IndexVersion, decoded, live_postings

__all__ = [
    "MAX_SAMPLE",
    "SAMPLE_PER_LIST",
    "IndexVersion",
    "VectorError",
    "VectorIndexConsumer",
    "decoded",
    "ivf",
    "live_postings",
    "vector_array",
]
