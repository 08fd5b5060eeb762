"""Bulk operations: one operation applied to every job a selector matches.

:mod:`~lakeprop.bulk.model` holds the values and states, :mod:`~lakeprop.bulk.plan`
turns a request into tasks and a task into catalog commands, and
:mod:`~lakeprop.bulk.executor` runs them from the micro-batch.
"""
