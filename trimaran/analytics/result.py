"""What an audit returns (``AuditResult``) and how its frames name a message: below the replay that
builds them and the report that reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass
class AuditResult:
    ok: bool
    invariants: dict[str, dict[str, Any]]
    counts: dict[str, Any]
    violations: DataFrame
    lives: DataFrame
    frames: dict[str, DataFrame] = field(default_factory=dict)
    seconds: float = 0.0
    # Per (queue, group) — group None for the queue itself — messages per outcome (life.OUTCOMES).
    outcomes: dict[tuple[str, str | None], dict[str, int]] = field(default_factory=dict)
    # Messages standing for each outcome: (queue, offset, epoch, outcome), for the report's pages.
    samples: list[tuple[str, int, int, str]] = field(default_factory=list)
    # Per vhost, violations per rule (analytics/tenants.py): each tenant's own share of the failures.
    violations_by_vhost: dict[str, dict[str, int]] = field(default_factory=dict)


def _message_id(queue: Column, offset: Column, epoch: Column) -> Column:
    from pyspark.sql import functions as F

    base = F.concat(queue, F.lit(":"), offset.cast("string"))
    return F.when(epoch > 0, F.concat(base, F.lit("@epoch"), epoch.cast("string"))).otherwise(base)
