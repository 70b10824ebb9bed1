"""SQL for the MQTT front end: retained messages and persistent sessions.

Blocking calls; the broker runs them on a worker thread, a whole batch per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import Delete, Engine, delete, select

from trimaran.broker.message import Message
from trimaran.storage.engine import now_ms
from trimaran.storage.schema import mqtt_sessions, retained_messages
from trimaran.storage.serialize import message_from, properties_json


@dataclass(slots=True)
class StoredSession:
    client_id: str
    protocol_level: int
    expiry_interval_s: int
    disconnected_at: int | None
    state: str  # the whole session as JSON (mqtt.session.Session.to_json)


class MqttStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- retained ---------------------------------------------------------------------------------

    def load_retained(self) -> list[Message]:
        now = now_ms()
        with self.engine.connect() as connection:
            rows = connection.execute(select(retained_messages)).all()
        return [
            message_from(row.topic, row.payload, row.qos, True, row.properties)
            for row in rows
            if row.expires_at is None or row.expires_at > now
        ]

    def write_retained(self, changes: Mapping[str, Message | None]) -> None:
        """Apply a batch of retained changes in one transaction; ``None`` deletes."""
        if not changes:
            return
        now = now_ms()
        with self.engine.begin() as connection:
            connection.execute(delete(retained_messages).where(retained_messages.c.topic.in_(list(changes))))
            rows = [
                {
                    "topic": topic,
                    "payload": message.payload,
                    "qos": message.qos,
                    "properties": properties_json(message),
                    "expires_at": message.expires_at_ms,
                    "updated_at": now,
                }
                for topic, message in changes.items()
                if message is not None
            ]
            if rows:
                connection.execute(retained_messages.insert(), rows)

    # -- sessions ---------------------------------------------------------------------------------

    def load_sessions(self) -> list[StoredSession]:
        with self.engine.connect() as connection:
            return [
                StoredSession(
                    row.client_id, row.protocol_level, row.expiry_interval_s, row.disconnected_at, row.state
                )
                for row in connection.execute(select(mqtt_sessions))
            ]

    def save_sessions(self, sessions: Iterable[StoredSession]) -> None:
        """Replace each session's row, all in one transaction."""
        batch = list(sessions)
        if not batch:
            return
        now = now_ms()
        with self.engine.begin() as connection:
            connection.execute(_delete_sessions([s.client_id for s in batch]))
            connection.execute(
                mqtt_sessions.insert(),
                [
                    {
                        "client_id": s.client_id,
                        "protocol_level": s.protocol_level,
                        "expiry_interval_s": s.expiry_interval_s,
                        "disconnected_at": s.disconnected_at,
                        "state": s.state,
                        "updated_at": now,
                    }
                    for s in batch
                ],
            )

    def delete_sessions(self, client_ids: Iterable[str]) -> None:
        ids = list(client_ids)
        if ids:
            with self.engine.begin() as connection:
                connection.execute(_delete_sessions(ids))


def _delete_sessions(client_ids: list[str]) -> Delete:
    return delete(mqtt_sessions).where(mqtt_sessions.c.client_id.in_(client_ids))
