"""Queue names, ``$queue/`` topics and the policy decisions: retry and backoff, expiry, where and
how a message dies (dead-letter target, x-death)."""

from __future__ import annotations

import functools
from typing import Final

from trimaran.broker.message import Message, now_ms
from trimaran.config import QueuePolicySettings
from trimaran.vhosts import TENANT, key_prefix, prefix, split_key

QUEUE_PREFIX: Final = "$queue/"
DLQ_PREFIX: Final = "$dlq/"
CONTROLS: Final = frozenset({"ack", "nack", "reject", "commit"})
MAX_NAME: Final = 255
DEFAULT_GROUP: Final = "$default"

# User properties the manager writes on dead-lettered messages (and strips from publishes, so a
# publisher cannot forge a history).
DLQ_PROPERTIES: Final = (
    "x-dead-letter-queue",
    "x-dead-letter-topic",
    "x-dead-letter-group",
    "x-dead-letter-attempts",
    "x-dead-letter-reason",
    "x-dead-letter-time",
)


class QueueError(Exception):
    """A refused queue operation; ``reason`` is a short machine-readable word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def validate_queue_name(name: str) -> None:
    """A queue key: ``[$vhost/<v>/][$dlq/]<name>`` (trimaran/vhosts.py); the whole key is stored in
    255 characters, so a long vhost name leaves a shorter queue name."""
    base = split_key(name)[1]
    base = base[len(DLQ_PREFIX) :] if base.startswith(DLQ_PREFIX) else base
    if not base or len(name) > MAX_NAME:
        raise QueueError("bad-name", f"queue name must be 1-{MAX_NAME} characters")
    if any(c in base for c in "/+#\x00"):
        raise QueueError("bad-name", f"queue name {name!r} contains '/', '+', '#' or NUL")


ParsedQueueTopic = tuple[str, str, str | None]


def parse_queue_topic(topic: str) -> ParsedQueueTopic | None:
    """``$queue/<name>[/<routing key...>][/$ack|$nack|$reject|$commit]`` -> (queue, key, control).

    Dead-letter queues are addressed as ``$queue/$dlq/<name>/...``. Returns ``None`` for a topic that
    is not a queue topic, has an empty or invalid name, or a control word that is not the last level.
    """
    if len(topic) <= _CACHED_TOPIC_MAX:  # every queue publish and delivery asks again
        return _parse_cached(topic)
    return _parse(topic)


_CACHED_TOPIC_MAX = 256  # with 4,096 entries at most ~1 MB: the cache is bounded in bytes too


@functools.lru_cache(maxsize=4096)
def _parse_cached(topic: str) -> ParsedQueueTopic | None:
    return _parse(topic)


def _parse(topic: str) -> ParsedQueueTopic | None:
    vhost_prefix = ""
    if topic.startswith(TENANT):  # a tenant's $queue/ topic: its queue key carries the same prefix
        vhost, tail = split_key(topic)
        vhost_prefix = prefix(vhost)
        topic = tail
    if not topic.startswith(QUEUE_PREFIX):
        return None
    levels = topic[len(QUEUE_PREFIX) :].split("/")
    if levels[0] == "$dlq":
        if len(levels) < 2:
            return None
        name = vhost_prefix + DLQ_PREFIX + levels[1]
        rest = levels[2:]
    else:
        name = vhost_prefix + levels[0]
        rest = levels[1:]
    try:
        validate_queue_name(name)
    except QueueError:
        return None
    control: str | None = None
    if rest and rest[-1].startswith("$") and rest[-1][1:] in CONTROLS:
        control = rest.pop()[1:]
    for level in rest:
        if level.startswith("$") and level[1:] in CONTROLS:
            return None
    return name, "/".join(rest), control


def queue_topic(name: str, routing_key: str = "") -> str:
    """The ``$queue/`` topic of a queue key, behind the key's vhost prefix (trimaran/vhosts.py)."""
    if name.startswith(TENANT):
        head = key_prefix(name)
        base = head + QUEUE_PREFIX + name[len(head) :]
    else:
        base = QUEUE_PREFIX + name
    return f"{base}/{routing_key}" if routing_key else base


def is_dead_letter_queue(name: str) -> bool:
    """A ``$dlq/`` queue of any vhost."""
    return split_key(name)[1].startswith(DLQ_PREFIX)


def dead_letter_target(name: str, policy: QueuePolicySettings) -> str | None:
    """Where rejected messages go, in the queue's own vhost; ``None`` when dead-lettering is off (a
    DLQ's own rejects)."""
    vhost, base = split_key(name)
    target = policy.dead_letter
    if target is not None:
        target = target.strip()
        if target.lower() in ("", "none", "off"):
            return None
        if target.startswith(QUEUE_PREFIX):
            target = target[len(QUEUE_PREFIX) :]
        return prefix(vhost) + target
    if base.startswith(DLQ_PREFIX):
        return None
    return prefix(vhost) + DLQ_PREFIX + base


def backoff_s(policy: QueuePolicySettings, attempts: int) -> float:
    """Delay before the next attempt after ``attempts`` failed ones (1 -> initial)."""
    delay = policy.backoff_initial_s * policy.backoff_multiplier ** max(0, attempts - 1)
    return float(min(delay, policy.backoff_max_s))


def retry_after_ms(policy: QueuePolicySettings, failed: int, delay_s: float | None) -> int | None:
    """How a failed attempt is retried: the delay before the next one (``delay_s`` when the consumer
    asked for one, else the backoff), or ``None`` when ``failed`` attempts exhaust ``max_attempts``
    and the message is dead-lettered instead."""
    if failed >= policy.max_attempts:
        return None
    delay = backoff_s(policy, failed) if delay_s is None else max(0.0, delay_s)
    return int(delay * 1000)


def exhausted(policy: QueuePolicySettings, failed: int) -> bool:
    """A delivery that came back unsettled (time-out, disconnect) after ``failed`` attempts is
    dead-lettered rather than offered again."""
    return failed >= policy.max_attempts


#: Why a message died, in RabbitMQ's words (x-death ``reason``).
DEATH_EXPIRED: Final = "expired"
DEATH_REJECTED: Final = "rejected"
DEATH_LIMIT: Final = "delivery_limit"
DEATH_MAXLEN: Final = "maxlen"


def death_kind(reason: str) -> str:
    if reason == "max_attempts":
        return DEATH_LIMIT
    if reason in (DEATH_EXPIRED, DEATH_MAXLEN):
        return reason
    return DEATH_REJECTED


def with_death(message: Message, queue: str, reason: str) -> Message:
    """A copy of ``message`` whose ``extra["deaths"]`` records this death as RabbitMQ's x-death
    does: one entry per (queue, reason), newest first, its count raised on each cycle; the first
    death is kept apart (x-first-death-*). Protocol-neutral: the AMQP 0.9.1 mapping turns it into
    headers."""
    extra = dict(message.extra)
    previous = extra.get("deaths")
    deaths = [dict(d) for d in previous if isinstance(d, dict)] if isinstance(previous, list) else []
    exchange = extra.get("exchange")
    key = extra.get("routing_key")
    for i, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            count = death.get("count")
            death["count"] = (count if isinstance(count, int) else 0) + 1
            deaths.insert(0, deaths.pop(i))
            break
    else:
        death = {
            "queue": queue,
            "reason": reason,
            "count": 1,
            "time": now_ms(),
            "exchange": exchange if isinstance(exchange, str) else "",
            "routing_keys": [key if isinstance(key, str) else queue],
        }
        expiration = extra.get("expiration")
        if isinstance(expiration, str):
            death["original_expiration"] = expiration
        deaths.insert(0, death)
    extra["deaths"] = deaths
    extra.pop("expiration", None)  # a dead letter does not expire by its old TTL
    if "first_death" not in extra:
        extra["first_death"] = {"queue": queue, "reason": reason, "exchange": deaths[0]["exchange"]}
    return message.copy_with(extra=extra, expires_at_ms=None)


def expiry_ms(policy: QueuePolicySettings, published_at: int, message_expiry: int | None) -> int | None:
    """The earlier of the queue's TTL and the message's own expiry."""
    ttl = policy.ttl_s
    at = published_at + int(ttl * 1000) if ttl is not None else None
    if message_expiry is not None and (at is None or message_expiry < at):
        at = message_expiry
    return at


def filter_matches(routing_filter: str | None, routing_key: str) -> bool:
    """MQTT-style filter on the routing key (``+`` one level, ``#`` the rest); ``None`` matches all."""
    if routing_filter is None or routing_filter == "#":
        return True
    f_levels = routing_filter.split("/")
    t_levels = routing_key.split("/") if routing_key else []
    n = len(t_levels)
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= n:
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == n
