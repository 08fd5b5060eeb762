"""The whole configuration, and how it is loaded.

Settings come from a TOML file per environment (``conf/local.toml``,
``conf/cluster.toml``, ``conf/databricks.toml``), then from environment
variables ``LAKEPROP__<SECTION>__<KEY>`` and ``--set section.key=value``
overrides. Values of the form ``${NAME}`` are read from the environment, which
is how secrets (Kafka SASL passwords and the like) reach the service: never
from a file in the repository. Each value is converted by its field's type,
durations by their field's metadata (:func:`~lakeprop.config.fields.duration`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from lakeprop.config import sections
from lakeprop.config.fields import duration, is_duration, positive
from lakeprop.config.tenants import TenantsConfig, account_values
from lakeprop.errors import InvalidConfigError, LakepropError
from lakeprop.spec import parse_duration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_PREFIX = "LAKEPROP__"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class AppConfig:
    """Everything the streaming app needs."""

    kafka: sections.KafkaConfig = field(default_factory=sections.KafkaConfig)
    state: sections.StateConfig = field(default_factory=sections.StateConfig)
    tables: sections.TablesConfig = field(default_factory=sections.TablesConfig)
    spark: sections.SparkConfig = field(default_factory=sections.SparkConfig)
    local_broker: sections.LocalBrokerConfig = field(default_factory=sections.LocalBrokerConfig)
    engine: sections.EngineConfig = field(default_factory=sections.EngineConfig)
    notifications: sections.NotificationsConfig = field(
        default_factory=sections.NotificationsConfig
    )
    metrics: sections.MetricsConfig = field(default_factory=sections.MetricsConfig)
    events: sections.EventsConfig = field(default_factory=sections.EventsConfig)
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    cluster: sections.ClusterConfig = field(default_factory=sections.ClusterConfig)
    tick_interval: float = duration(10.0)
    """How often the service looks for due work it is not told of: without commit
    notifications, every table with a job is probed once per tick; retries, periodic
    jobs, sweeps and housekeeping run at most once per tick. A commit notice, a
    finished iteration or a change log message starts a micro-batch at once."""
    poll_interval: float = duration(1.0)
    """How often the query asks the broker for change log messages and wake-ups (an
    offset request, no micro-batch): the longest a notified commit or a registration
    waits to start. At most ``tick_interval`` is used."""
    query_name: str = "lakeprop-changelog"
    """The streaming query's name."""

    def __post_init__(self) -> None:
        positive(self.tick_interval, "tick_interval")
        positive(self.poll_interval, "poll_interval")

    @property
    def poll(self) -> float:
        """Seconds between the query's triggers: ``poll_interval``, at most a tick."""
        return min(self.poll_interval, self.tick_interval)


def _expand_env(value: Any, where: str, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):

        def lookup(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise InvalidConfigError(f"{where} refers to ${{{name}}}, which is not set")
            return env[name]

        return _ENV_REF.sub(lookup, value)
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}", env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, where, env) for v in value]
    return value


def _set_path(tree: dict[str, Any], dotted: str, raw: str) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise InvalidConfigError(f"cannot set {dotted}: {part} is not a section")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    node[parts[-1]] = value


def _same_kind(default: Any, value: Any) -> bool:
    """Whether a setting's value has the type of its default (scalars only)."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    return True


Convert = Callable[[Any, str], Any]
"""Turns a setting as TOML gives it into the field's value, or raises InvalidConfigError."""


def _duration_value(value: Any, path: str) -> float:
    try:
        return parse_duration(value, path)
    except LakepropError as exc:
        raise InvalidConfigError(str(exc)) from None


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidConfigError(f"{path} must be a list")
    return tuple(value)


def _string_table(value: Any, path: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidConfigError(f"{path} must be a table of strings")
    return {str(k): str(v) for k, v in value.items()}


def _table_of_sections(value: Any, path: str) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise InvalidConfigError(f"{path} must be a table of sections, one per account")
    return {str(k): account_values(v, f"{path}.{k}") for k, v in value.items()}


CONVERSIONS: dict[Any, Convert] = {
    tuple[str, ...]: _strings,
    Mapping[str, str]: _string_table,
    dict[str, dict[str, Any]]: _table_of_sections,
}
"""How a setting of each field type is converted (by the field's resolved type)."""


def _converter(f: Field[Any], hint: Any) -> Convert | None:
    if is_duration(f):
        return _duration_value
    return CONVERSIONS.get(hint)


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InvalidConfigError(f"unknown setting(s) {unknown} in {where or 'top level'}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        f = known[name]
        path = f"{where}.{name}" if where else name
        default = f.default_factory() if callable(f.default_factory) else f.default
        convert = _converter(f, hints[name])
        if is_dataclass(hints[name]):
            if not isinstance(value, dict):
                raise InvalidConfigError(f"{path} must be a section")
            kwargs[name] = _build(hints[name], value, path)
        else:
            kwargs[name] = value if convert is None else convert(value, path)
        if not _same_kind(default, kwargs[name]):
            raise InvalidConfigError(
                f"{path} must be of type {type(default).__name__}, got {kwargs[name]!r}"
            )
    try:
        return cls(**kwargs)
    except InvalidConfigError:
        raise
    except Exception as exc:  # a spec helper raised its own error type
        raise InvalidConfigError(f"{where}: {exc}") from exc


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> AppConfig:
    """Read a TOML file (optional), then environment and explicit overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise InvalidConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidConfigError(f"config file {path} is not valid TOML: {exc}") from None
    env = os.environ if environ is None else environ
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            _set_path(data, name[len(ENV_PREFIX) :].lower().replace("__", "."), value)
    for dotted, value in (overrides or {}).items():
        _set_path(data, dotted, value)
    config: AppConfig = _build(AppConfig, _expand_env(data, "config", env), "")
    return config
