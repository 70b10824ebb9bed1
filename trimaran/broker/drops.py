"""Messages dropped on their way to a subscriber: counted by reason and vhost, and told once a minute
per subscriber in the log.

A drop happens only where the protocol lets a server drop and the operator set the bound: nothing
acknowledged to a publisher is dropped to make room (the runtime slows the publishers instead, see
``runtime/flow.py``). Each reason names its bound, which the log line gives.
"""

from __future__ import annotations

import logging
import time
from typing import Final

log = logging.getLogger(__name__)

OUTBOX_FULL: Final = "outbox_full"
OFFLINE_QUEUE_FULL: Final = "offline_queue_full"
TOO_LARGE: Final = "too_large"
EXPIRED: Final = "expired"
NO_SHARE_MEMBER: Final = "no_share_member"
QUEUE_OVERFLOW: Final = "queue_overflow"
RECEIVER_BACKLOG_FULL: Final = "receiver_backlog_full"
CLUSTER_FORWARD: Final = "cluster_forward"
LINK_AWAY: Final = "link_away"
LINK_UNQUEUED: Final = "link_unqueued"
LINK_LOOP: Final = "link_loop"

#: The label of ``trimaran_messages_dropped_total`` and what its log line says.
REASONS: Final = {
    OUTBOX_FULL: "QoS 0 past the outbox of a subscriber that does not read (limits.outbox_bytes)",
    OFFLINE_QUEUE_FULL: "an offline session's queue at its bound (limits.session_queue_size / _bytes)",
    TOO_LARGE: "larger than the client's maximum packet or message size",
    EXPIRED: "its expiry passed before it could be sent",
    NO_SHARE_MEMBER: "its shared subscription has no member left",
    QUEUE_OVERFLOW: "a queue's max-length refused the router's copy (x-overflow)",
    RECEIVER_BACKLOG_FULL: "a topic receiver (AMQP 1.0) without credit, its backlog full (amqp1.outbox_size)",
    CLUSTER_FORWARD: "not forwarded to the other nodes: past the forward buffer's last-resort bound "
    "(100,000; publishers are held from cluster.forward_backpressure_messages), or not encodable",
    LINK_AWAY: "for a bridge or shovel whose remote is away: QoS 0, or past its queue_bytes",
    LINK_UNQUEUED: "not written to a bridge's or shovel's queue: the storage refused it",
    LINK_LOOP: "a bridge or shovel sent it out before (x-trimaran-via): a loop",
}

LOG_EVERY_S: Final = 60.0
_REMEMBERED: Final = 10_000  # subscribers whose last log line is remembered, at most


class Drops:
    """The broker's drop counts (``counts[(reason, vhost)]``) and their log lines."""

    __slots__ = ("_logged", "counts", "total")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.total = 0
        # subscriber -> (monotonic time of its last line, drops since): one line a minute each
        self._logged: dict[str, tuple[float, int]] = {}

    def drop(self, reason: str, vhost: str, subscriber: str, count: int = 1) -> None:
        key = (reason, vhost)
        self.counts[key] = self.counts.get(key, 0) + count
        self.total += count
        now = time.monotonic()
        last = self._logged.get(subscriber)
        if last is not None and now - last[0] < LOG_EVERY_S:
            self._logged[subscriber] = (last[0], last[1] + count)
            return
        if len(self._logged) >= _REMEMBERED:
            self._forget(now)
        since = 0 if last is None else last[1]
        self._logged[subscriber] = (now, 0)
        log.warning(
            "%d message(s) for %s in vhost %r dropped: %s%s",
            count,
            subscriber or "?",
            vhost,
            REASONS.get(reason, reason),
            f" ({since} more in the last minute, any reason)" if since else "",
        )

    def _forget(self, now: float) -> None:
        stale = [who for who, (at, _) in self._logged.items() if now - at >= LOG_EVERY_S]
        for who in stale or list(self._logged)[: _REMEMBERED // 2]:
            del self._logged[who]
