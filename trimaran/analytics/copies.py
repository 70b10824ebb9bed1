"""Every dead-letter and redrive copy traced to its cause, and every cause to its copy, in plain Python.

A message leaves its queue as a copy in another in the same commit as the event that says why: a
group's ``dead_lettered`` (reason ``<why> -> <queue>:<offset>[,...]``), a queue-level ``expired`` or
``dropped`` routed through a dead-letter exchange (``ttl -> <queue>[,...]``, no offsets), or an
operator's ``redriven`` (``-> <queue>:<offset>``). The copy is a ``published`` event in the target
whose reason names the source: ``dead_letter from <queue>:<offset>`` or ``redrive from
<queue>:<offset>``. Each cause's copy must be there once, and each copy must have its cause once: a
copy with no cause, or a cause with no copy (or a second copy), breaks ``copies_traced``, and the
violation names both ends. The replay hands these events out as it meets them (``life.CAUSES``,
``life.COPY_PREFIXES``); they are few (one per dead letter), so the driver matches them.

Only queues in the audited ``queues`` table are held to it: an in-memory dead-letter queue leaves no
rows, and an unselected one was not read. A copy of source offset -1 is a publish refused by a full
queue and dead-lettered at once (``Letters.refused``): it has no event in its source.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trimaran.analytics.life import COPY_PREFIXES, message_id

RULE = "copies_traced"
_FROM = dict(zip(COPY_PREFIXES, ("dead_letter", "redrive"), strict=True))


def _family(kind: str) -> str:
    return "redrive" if kind == "redriven" else "dead_letter"


def _targets(reason: str | None) -> list[tuple[str, int | None]] | None:
    """The copies a cause names, (queue, offset or None); None when it names none."""
    if reason is None:
        return None
    _, arrow, where = reason.partition("-> ")
    if not arrow or not where:
        return None
    found: list[tuple[str, int | None]] = []
    for part in where.split(","):
        name, colon, number = part.rpartition(":")
        if colon and name and number.lstrip("-").isdigit():
            found.append((name, int(number)))
        else:
            found.append((part, None))
    return found


def _source(reason: str | None) -> tuple[str, str, int] | None:
    """(family, source queue, source offset) of a copy's publication, None if it is no copy."""
    if reason is None:
        return None
    for prefix, family in _FROM.items():
        if reason.startswith(prefix):
            name, colon, number = reason[len(prefix) :].rpartition(":")
            if colon and name and number.lstrip("-").isdigit():
                return family, name, int(number)
    return None


def _violation(queue: str, group: str | None, offset: int | None, epoch: int, event_id: int | None,
               detail: str) -> tuple[Any, ...]:  # fmt: skip
    return (RULE, queue, group, offset, epoch, message_id(queue, offset, epoch), event_id, detail)


def trace(
    causes: Iterable[tuple[str, int, int, int, str, str | None, str | None]],
    copies: Iterable[tuple[str, int, int, int, str | None]],
    audited: set[str],
) -> list[tuple[Any, ...]]:
    """Match ``causes`` (queue, offset, epoch, event id, kind, group, reason) with ``copies``
    (queue, offset, epoch, event id, reason); returns violations in ``life.VIOLATION``'s order."""
    # Copies by what they claim: (family, target, target offset, source, source offset).
    unclaimed: dict[tuple[str, str, int, str, int], list[tuple[int, int]]] = {}
    # The same, by (family, target, source, source offset): for causes that name no target offset.
    by_source: dict[tuple[str, str, str, int], list[tuple[str, str, int, str, int]]] = {}
    for target_queue, target_offset, target_epoch, copy_id, copy_reason in sorted(copies, key=lambda c: c[3]):
        claimed = _source(copy_reason)
        if claimed is None or claimed[2] < 0:
            continue
        kin, name, number = claimed
        made = (kin, target_queue, target_offset, name, number)
        waiting = unclaimed.setdefault(made, [])
        if not waiting:
            by_source.setdefault((kin, target_queue, name, number), []).append(made)
        waiting.append((target_epoch, copy_id))
    total = {key: len(claims) for key, claims in unclaimed.items()}
    found: list[tuple[Any, ...]] = []
    loose: list[tuple[tuple[Any, ...], str, str]] = []  # causes naming a queue but no offset
    for row in sorted(causes, key=lambda c: c[3]):
        queue, offset, epoch, event_id, kind, group, reason = row
        targets = _targets(reason)
        if not targets:
            if kind in ("dead_lettered", "redriven"):  # expired and dropped go nowhere without one
                found.append(_violation(queue, group, offset, epoch, event_id,
                                        f"{kind} ({reason or 'no reason'}) names no copy"))  # fmt: skip
            continue
        family = _family(kind)
        for target, at in targets:
            if at is None:
                loose.append((row, family, target))
                continue
            claims = unclaimed.get((family, target, at, queue, offset))
            if claims:
                claims.pop(0)
            elif target in audited:
                found.append(_violation(queue, group, offset, epoch, event_id,
                                        f"{kind} into {target}:{at}, but {target}:{at} is no "
                                        f"copy of {message_id(queue, offset, epoch)}"))  # fmt: skip
    for row, family, target in loose:
        queue, offset, epoch, event_id, kind, group, _ = row
        keys = by_source.get((family, target, queue, offset), [])
        match = next((k for k in keys if unclaimed[k]), None)
        if match is not None:
            unclaimed[match].pop(0)
        elif target in audited:
            here = message_id(queue, offset, epoch)
            why = f"{kind} into {target}, but no copy of {here} arrived there"
            found.append(_violation(queue, group, offset, epoch, event_id, why))
    for (family, target, number, name, source_offset), left in sorted(unclaimed.items()):
        if name not in audited:
            continue
        cause = "dead_lettered, expired or dropped" if family == "dead_letter" else "redriven"
        origin = message_id(name, source_offset, 0)
        for copy_epoch, copy_id in left:
            why = (
                f"a second copy of {origin} at {target}:{number}; its {cause} event names one"
                if total[(family, target, number, name, source_offset)] > len(left)
                else f"a copy of {origin}, but {origin} has no {cause} event naming {target}:{number}"
            )
            found.append(_violation(target, None, number, copy_epoch, copy_id, why))
    return found
