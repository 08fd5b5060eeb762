"""Pipelines: jobs that read other jobs' targets.

:mod:`lakeprop.pipeline.graph` is the graph of the live jobs (pure, no Spark);
:mod:`lakeprop.pipeline.render` draws it as text, Mermaid or DOT.
"""
