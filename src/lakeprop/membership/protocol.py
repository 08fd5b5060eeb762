"""How a seat joins the membership group, under either of Kafka's group protocols.

* ``classic`` (any broker): the members assign among themselves with the
  ``cooperative-sticky`` assignor; each member sets its own session timeout and
  heartbeat interval.
* ``consumer`` (KIP-848, Kafka 4.0 and later): the broker assigns, incrementally
  (a slot is never held twice, as with cooperative-sticky); the session timeout
  and heartbeat interval are the group's configs (``consumer.session.timeout.ms``,
  ``consumer.heartbeat.interval.ms``), which a seat sets before it joins and which
  must lie within the broker's ``group.consumer.min/max.*`` bounds.

With ``static_membership`` the seat joins as a static member, its
``group.instance.id`` being the instance id: an instance that stops and comes
back within the session timeout gets its slots back without a rebalance, so a
rolling restart moves none. A second live process with the same id is refused
by the coordinator (classic: the older member is fenced; consumer: the newer one
cannot join), which the seat treats as being dropped.
"""

from __future__ import annotations

from typing import Any

from lakeprop.config import ClusterConfig, KafkaConfig
from lakeprop.errors import BrokerError, InvalidConfigError
from lakeprop.kafka import admin

CLASSIC = "classic"
CONSUMER = "consumer"


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def consumer_settings(cluster: ClusterConfig, instance: str, group: str) -> dict[str, Any]:
    """The membership consumer's settings (beside the connection's)."""
    joined: dict[str, Any] = {
        "group.id": group,
        "client.id": instance,
        "enable.auto.commit": False,
        "auto.offset.reset": "latest",
    }
    if cluster.static_membership:
        joined["group.instance.id"] = instance
    if cluster.group_protocol == CONSUMER:
        return joined | {"group.protocol": CONSUMER}
    return joined | {
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": _ms(cluster.session_timeout),
        "heartbeat.interval.ms": _ms(cluster.heartbeat_interval),
    }


def group_configs(cluster: ClusterConfig) -> dict[str, str]:
    """The group's own configs a seat sets before joining (``consumer`` only)."""
    if cluster.group_protocol != CONSUMER:
        return {}
    return {
        "consumer.session.timeout.ms": str(_ms(cluster.session_timeout)),
        "consumer.heartbeat.interval.ms": str(_ms(cluster.heartbeat_interval)),
    }


def configure_group(kafka: KafkaConfig, cluster: ClusterConfig, group: str, timeout: float) -> None:
    """Set the group's session timeout and heartbeat interval (``consumer`` only);
    a broker that refuses them is an error naming its bounds."""
    configs = group_configs(cluster)
    if not configs:
        return
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka import admin as kafka_admin

    k: Any = kafka_admin  # re-exports mypy does not see
    entries = [
        k.ConfigEntry(name, value, incremental_operation=k.AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = k.ConfigResource(k.ResourceType.GROUP, group, incremental_configs=entries)
    client = admin(kafka)  # held until the answer: a collected client drops its requests
    try:
        client.incremental_alter_configs([resource])[resource].result(timeout)
    except KafkaException as exc:
        error = exc.args[0]
        if error.code() == KafkaError.INVALID_CONFIG:
            raise InvalidConfigError(
                f"the broker refuses cluster.session_timeout {cluster.session_timeout:g}s or "
                f"cluster.heartbeat_interval {cluster.heartbeat_interval:g}s for the "
                f"membership group {group} under group_protocol 'consumer' "
                f"({error.str()}): keep them within the broker's "
                "group.consumer.min/max.session.timeout.ms and "
                "group.consumer.min/max.heartbeat.interval.ms (45 s and 5 s at least by "
                "default), or use group_protocol 'classic'"
            ) from exc
        raise BrokerError(f"could not configure the membership group {group}: {error}") from exc


def still_a_member(code: int) -> bool:
    """Whether a commit refused with ``code`` still means the coordinator knows the seat
    (a rebalance is under way, or the seat's generation or epoch is behind by one)."""
    from confluent_kafka import KafkaError

    return code in (
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.STALE_MEMBER_EPOCH,
    )
