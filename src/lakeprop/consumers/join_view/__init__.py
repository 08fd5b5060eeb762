"""The ``join_view`` consumer: a derived table defined by a SQL join of two or three
Delta tables (its query's shape: :mod:`lakeprop.consumers.join_view.query`)."""
