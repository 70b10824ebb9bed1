"""Topic names, topic filters, shared subscriptions and AMQP 0.9.1 routing keys.

The router speaks MQTT topics: levels separated by ``/``, ``+`` matches exactly one level (which may
be empty), ``#`` matches the parent level and any number of levels below it and must be last.

Rules enforced here (MQTT 5.0 section 4.7, 3.1.1 section 4.7):

- names and filters are non-empty, at most 65535 bytes of UTF-8, contain no U+0000 and no unpaired
  surrogate (they could not be encoded as UTF-8);
- a topic *name* contains no ``+`` or ``#`` at all;
- in a *filter* ``+`` and ``#`` occupy a whole level, and ``#`` is the last level.

Control characters and Unicode non-characters are allowed: the specs say "SHOULD NOT", and refusing
them would break clients that other brokers accept.

Shared subscriptions: ``$share/<group>/<filter>``; the group is non-empty and contains no ``/``, ``+``
or ``#``; the filter is a valid filter (and may itself start with ``$``, e.g. ``$queue/orders``).

AMQP 0.9.1 (``amq.topic`` routing and binding keys) <-> MQTT, the same mapping as RabbitMQ's MQTT
plugin:

- the separators swap: ``.`` in a routing key becomes ``/`` in the topic and ``/`` becomes ``.``.
  Swapping is a bijection on strings, so a dot inside an MQTT level (``v1.2/x`` <-> ``v1/2.x``) and a
  slash inside an AMQP word survive the round trip, and empty levels map to empty words
  (``a//b`` <-> ``a..b``, ``/a`` <-> ``.a``);
- in binding keys a whole word ``*`` is ``+`` and ``#`` is ``#``;
- what one side can say and the other cannot raises :class:`TopicError`: an empty routing key (an MQTT
  topic cannot be empty), ``+`` or ``#`` inside a routing key, ``#`` before the last word of a binding
  key (``a.#.b``), ``+``/``#`` inside a binding word (``a.b+``), a whole ``+`` word in a binding key
  (literal in AMQP, a wildcard in MQTT), and a whole ``*`` level in an MQTT filter (literal in MQTT, a
  wildcard in AMQP). The front end treats such keys as unroutable / refuses the binding.
- ``*`` and ``#`` inside a *routing* key (a publish) are ordinary characters in AMQP; ``*`` stays as is,
  ``#`` cannot appear in an MQTT topic name and raises.
- a routing key whose first word starts with ``$`` becomes a ``$`` topic, which a first-level ``+`` or
  ``#`` does not match (the MQTT rule; in RabbitMQ ``#`` would match it). That is deliberate: AMQP
  consumers binding ``#`` do not see ``$SYS`` either.
"""

from __future__ import annotations

from typing import Final

from trimaran.vhosts import TENANT, TENANT_LEVELS

__all__ = [
    "MAX_TOPIC_BYTES",
    "SHARE_PREFIX",
    "SharedFilter",
    "TopicError",
    "binding_key_to_filter",
    "filter_to_binding_key",
    "is_valid_topic_filter",
    "is_valid_topic_name",
    "join_shared",
    "routing_key_to_topic",
    "split_shared",
    "topic_matches",
    "topic_to_routing_key",
    "validate_topic_filter",
    "validate_topic_name",
]

MAX_TOPIC_BYTES: Final = 65535
SHARE_PREFIX: Final = "$share/"


class TopicError(ValueError):
    """An invalid topic name, topic filter, share name or untranslatable routing key."""


def _check_common(text: str, what: str) -> None:
    if not text:
        raise TopicError(f"{what} is empty")
    if "\x00" in text:
        raise TopicError(f"{what} contains U+0000")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise TopicError(f"{what} contains an unpaired surrogate") from None
    if size > MAX_TOPIC_BYTES:
        raise TopicError(f"{what} is {size} bytes of UTF-8, more than {MAX_TOPIC_BYTES}")


def validate_topic_name(name: str) -> None:
    """Raise :class:`TopicError` unless ``name`` is a valid topic name to publish to."""
    _check_common(name, "topic name")
    if "+" in name or "#" in name:
        raise TopicError("topic name contains a wildcard (+ or #)")


def validate_topic_filter(topic_filter: str) -> None:
    """Raise :class:`TopicError` unless ``topic_filter`` is a valid (non-shared) topic filter."""
    _check_common(topic_filter, "topic filter")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if level == "+":
            continue
        if level == "#":
            if i != last:
                raise TopicError("'#' must be the last level of a topic filter")
            continue
        if "+" in level or "#" in level:
            raise TopicError(f"wildcard inside level {level!r}: + and # must be a whole level")


def is_valid_topic_name(name: str) -> bool:
    # Plain ASCII without the characters a name may not hold is valid without the calls of the whole
    # check (a fleet's run checks each of its topics); anything else is checked whole.
    if name and name.isascii() and "\x00" not in name and "+" not in name and "#" not in name:
        return len(name) <= MAX_TOPIC_BYTES
    try:
        validate_topic_name(name)
    except TopicError:
        return False
    return True


def is_valid_topic_filter(topic_filter: str) -> bool:
    try:
        validate_topic_filter(topic_filter)
    except TopicError:
        return False
    return True


# A subscription filter split into its share group (None if not shared) and topic filter. A plain
# tuple: compiled, a NamedTuple is made by a Python-level __new__, two thirds of a split (a
# subscription splits its filter several times).
SharedFilter = tuple[str | None, str]


def split_shared(topic_filter: str) -> SharedFilter:
    """Split and validate a subscription filter that may be ``$share/<group>/<filter>``.

    ``$share`` alone (no slash) is an ordinary filter. Raises :class:`TopicError` for a malformed
    shared filter (empty group, group with ``+ # /``, missing or invalid filter) or invalid filter.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        validate_topic_filter(topic_filter)
        return None, topic_filter
    rest = topic_filter[len(SHARE_PREFIX) :]
    group, sep, inner = rest.partition("/")
    if not sep:
        raise TopicError("shared subscription has no topic filter after the share name")
    if not group:
        raise TopicError("shared subscription has an empty share name")
    if "+" in group or "#" in group:
        raise TopicError("share name contains a wildcard (+ or #)")
    _check_common(topic_filter, "shared topic filter")
    validate_topic_filter(inner)
    return group, inner


def join_shared(group: str | None, topic_filter: str) -> str:
    """The inverse of :func:`split_shared`."""
    if group is None:
        return topic_filter
    return f"{SHARE_PREFIX}{group}/{topic_filter}"


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a (non-shared) filter matches a topic name; the ``$`` rule included.

    A straightforward level-by-level check for one-off use (ACLs, tests). The router and the retained
    store use tries instead.
    """
    if topic.startswith(TENANT) and topic_filter.startswith(TENANT):
        # A tenant's tree (trimaran/vhosts.py): the $ rule holds at its own first level.
        vhost, rest = topic.split("/", TENANT_LEVELS), topic_filter.split("/", TENANT_LEVELS)
        if vhost[:TENANT_LEVELS] != rest[:TENANT_LEVELS] or len(vhost) <= TENANT_LEVELS:
            return False
        if len(rest) <= TENANT_LEVELS:
            return False
        return topic_matches(rest[TENANT_LEVELS], vhost[TENANT_LEVELS])
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    n_topic = len(t_levels)
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= n_topic:
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == n_topic


# --- AMQP 0.9.1 -------------------------------------------------------------------------------------

_SWAP: Final = str.maketrans({".": "/", "/": "."})


def routing_key_to_topic(routing_key: str) -> str:
    """MQTT topic name for an AMQP 0.9.1 routing key (a publish to ``amq.topic``)."""
    topic = routing_key.translate(_SWAP)
    validate_topic_name(topic)
    return topic


def topic_to_routing_key(topic: str) -> str:
    """AMQP 0.9.1 routing key for an MQTT topic name (a delivery to an AMQP consumer). Never fails."""
    return topic.translate(_SWAP)


def binding_key_to_filter(binding_key: str) -> str:
    """MQTT topic filter for an AMQP 0.9.1 ``amq.topic`` binding key."""
    words = binding_key.translate(_SWAP).split("/")
    last = len(words) - 1
    for i, word in enumerate(words):
        if word == "*":
            words[i] = "+"
        elif word == "#":
            if i != last:
                raise TopicError("'#' before the last word of a binding key has no MQTT equivalent")
        elif "+" in word or "#" in word:
            raise TopicError(f"binding key word {word!r} contains + or #, which MQTT cannot express")
    topic_filter = "/".join(words)
    validate_topic_filter(topic_filter)
    return topic_filter


def filter_to_binding_key(topic_filter: str) -> str:
    """AMQP 0.9.1 binding key for an MQTT topic filter (non-shared)."""
    validate_topic_filter(topic_filter)
    levels = topic_filter.translate(_SWAP).split(".")
    for i, level in enumerate(levels):
        if level == "+":
            levels[i] = "*"
        elif level == "*":
            raise TopicError("a literal '*' level has no AMQP 0.9.1 binding key equivalent")
    return ".".join(levels)
