"""What lakeprop's tests, benchmarks and scripts share (not part of the wheel).

Like Delta's ``delta.testing``: the local session builder, the seeded workload,
spec and row builders, from-scratch expectations, waiting helpers, raw Kafka
producing, and the generators of the docs' reference pages.
"""
