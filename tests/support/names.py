"""Names no other test run uses: queues, topics and exchanges on servers that live for a session."""

from __future__ import annotations

import uuid


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
