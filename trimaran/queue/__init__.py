"""Durable ``$queue/`` manager: work queues and streams, consumer groups, DLQ, group commit to SQL."""

from trimaran.queue.control import ack_by_id, commit_by_id, nack_by_id, parse_message_id, reject_by_id
from trimaran.queue.journal import Receipt, committed
from trimaran.queue.manager import (
    BrowseHandle,
    ConsumerHandle,
    GroupInfo,
    PublishResult,
    QueueConsumer,
    QueueDelivery,
    QueueInfo,
    QueueManager,
    message_id,
)
from trimaran.queue.policy import DEFAULT_GROUP, QueueError, parse_queue_topic, queue_topic

__all__ = [
    "DEFAULT_GROUP",
    "BrowseHandle",
    "ConsumerHandle",
    "GroupInfo",
    "PublishResult",
    "QueueConsumer",
    "QueueDelivery",
    "QueueError",
    "QueueInfo",
    "QueueManager",
    "Receipt",
    "ack_by_id",
    "commit_by_id",
    "committed",
    "message_id",
    "nack_by_id",
    "parse_message_id",
    "parse_queue_topic",
    "queue_topic",
    "reject_by_id",
]
