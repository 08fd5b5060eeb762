"""lakeprop: change propagation for the lakehouse.

What users call: the client (register, update and drop jobs through the change
log; read their status), the job key and spec, the configuration, full-text
search over a ``fulltext_index`` job, and the project's errors. The service
itself starts from ``lakeprop run`` (:mod:`lakeprop.cli`) or
:class:`lakeprop.service.app.PropagationApp`.
"""

from __future__ import annotations

from lakeprop import errors
from lakeprop.client.api import JobInfo, LakepropClient, Receipt
from lakeprop.client.search import SearchHit, search
from lakeprop.config import AppConfig, load_config
from lakeprop.consumers import Consumer, ConsumerContext
from lakeprop.spec import JobKey, JobSpec

__all__ = [
    "AppConfig",
    "Consumer",
    "ConsumerContext",
    "JobInfo",
    "JobKey",
    "JobSpec",
    "LakepropClient",
    "Receipt",
    "SearchHit",
    "errors",
    "load_config",
    "search",
]
