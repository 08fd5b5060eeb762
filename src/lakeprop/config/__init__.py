"""Typed, validated configuration: one dataclass per section (:mod:`.sections`,
:mod:`.tenants`), the whole of it and how it is loaded (:mod:`.app`)."""

from __future__ import annotations

from lakeprop.config.app import ENV_PREFIX, AppConfig, load_config
from lakeprop.config.fields import LOCAL_BOOTSTRAP, duration, is_duration
from lakeprop.config.sections import (
    ClusterConfig,
    EngineConfig,
    EventsConfig,
    KafkaConfig,
    LocalBrokerConfig,
    MetricsConfig,
    NotificationsConfig,
    SparkConfig,
    StateConfig,
    TablesConfig,
)
from lakeprop.config.tenants import TenantLimits, TenantsConfig

__all__ = [
    "ENV_PREFIX",
    "LOCAL_BOOTSTRAP",
    "AppConfig",
    "ClusterConfig",
    "EngineConfig",
    "EventsConfig",
    "KafkaConfig",
    "LocalBrokerConfig",
    "MetricsConfig",
    "NotificationsConfig",
    "SparkConfig",
    "StateConfig",
    "TablesConfig",
    "TenantLimits",
    "TenantsConfig",
    "duration",
    "is_duration",
    "load_config",
]
