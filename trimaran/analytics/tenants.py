"""The audit per vhost: which tenant each queue, message and violation belongs to.

A queue's key carries its vhost (``$vhost/<quoted name>/`` in front; none for ``/``:
trimaran/vhosts.py), and so does every row the audit reads, since each names its queue by key. The
vhost is therefore derived from the key, never joined: ``queues.vhost`` says the same by
construction, and the events of a deleted queue have no ``queues`` row left to join. People read a
queue and a message id as the tenant's clients name them (``jobs``, ``jobs:7``), with the vhost
beside it. The replay itself (``life.py``) keys on the whole key and knows nothing of vhosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trimaran.vhosts import DEFAULT_VHOST, TENANT, split_key

if TYPE_CHECKING:
    from pyspark.sql import Column

Outcomes = dict[tuple[str, Any], dict[str, int]]


def vhost_column(queue: Column) -> Column:
    """The vhost of the queue key in ``queue``, as a Spark column (``/`` for an unprefixed key)."""
    from pyspark.sql import functions as F

    quoted = F.split(queue, "/").getItem(1)
    return F.when(queue.startswith(TENANT), F.url_decode(quoted)).otherwise(F.lit(DEFAULT_VHOST))


def shown_id(message_id: str) -> str:
    """A message id (``<queue key>:<offset>``) as the tenant's consumers got it (``x-queue-message-id``)."""
    return split_key(message_id)[1]


def label(example: dict[str, Any]) -> dict[str, Any]:
    """A violation example with its ``vhost`` and its queue's ``name`` in the vhost added."""
    vhost, name = split_key(example["queue"]) if example.get("queue") else (DEFAULT_VHOST, None)
    return {**example, "vhost": vhost, "name": name}


def outcomes_by_vhost(outcomes: Outcomes) -> dict[str, Outcomes]:
    """The outcome counts per vhost, each keyed by (queue name in the vhost, group)."""
    split: dict[str, Outcomes] = {}
    for (queue, group), by in outcomes.items():
        vhost, name = split_key(queue)
        split.setdefault(vhost, {})[(name, group)] = by
    return split


def violations_by_vhost(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """How many violations of each rule each vhost has, from violation rows (``queue``, ``invariant``)."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        vhost = split_key(row["queue"])[0] if row.get("queue") else DEFAULT_VHOST
        mine = counts.setdefault(vhost, {})
        mine[row["invariant"]] = mine.get(row["invariant"], 0) + 1
    return counts


def vhost_summary(outcomes: Outcomes, violations: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """Per vhost: its queues (names in the vhost), its published messages and its violations per rule."""
    summary: dict[str, dict[str, Any]] = {}
    for vhost, mine in outcomes_by_vhost(outcomes).items():
        queues = sorted({name for name, _ in mine})
        published = sum(by.get("published", 0) for (_, group), by in mine.items() if group is None)
        summary[vhost] = {"queues": queues, "published": published, "violations": {}}
    for vhost, by_rule in violations.items():
        summary.setdefault(vhost, {"queues": [], "published": 0, "violations": {}})["violations"] = dict(
            sorted(by_rule.items())
        )
    return dict(sorted(summary.items()))
