"""A hung database bounds every write and /readyz answers within its own time-out."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from trimaran.app import App
from trimaran.broker.core import Broker
from trimaran.config import Settings
from trimaran.storage.engine import build_engine
from trimaran.storage.store import Storage


@pytest.mark.postgres
def test_postgres_statement_timeout_ends_a_hung_statement(postgres_url: str) -> None:
    storage = Storage.from_url(postgres_url, statement_timeout_s=0.3)
    try:
        with storage.engine.connect() as connection:
            assert connection.execute(text("SHOW statement_timeout")).scalar() == "300ms"
            started = time.monotonic()
            with pytest.raises(OperationalError, match="statement timeout"):
                connection.execute(text("SELECT pg_sleep(10)"))
            assert time.monotonic() - started < 3
            keepalive = connection.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
            assert keepalive["keepalives"] == "1"
            assert keepalive["tcp_user_timeout"] == "300"
    finally:
        storage.close()


class HungStorage(Storage):
    """A database whose answer never comes (a frozen host behind a live route)."""

    def __init__(self) -> None:
        super().__init__(build_engine("sqlite://"))
        self.release = threading.Event()

    def ping(self) -> bool:
        self.release.wait(30)
        return True


def _app(storage: Storage, broker: Any = None) -> App:
    """An app as if started, with no listener; /readyz is answered by the app (its AdminView)."""
    settings = Settings()
    settings.storage.ready_timeout_s = 0.3
    app = App(settings)
    app.storage, app.broker, app.ready = storage, cast(Broker, broker), True
    return app


@pytest.mark.anyio
async def test_readyz_answers_503_within_its_time_out_when_storage_hangs() -> None:
    storage = HungStorage()
    api = _app(storage).api
    try:
        started = time.monotonic()
        with anyio.fail_after(5):
            response = await api.readyz(None)  # type: ignore[arg-type]
        assert response.status == 503
        assert b'"storage":false' in response.body
        assert time.monotonic() - started < 2
    finally:
        storage.release.set()
        storage.close()


class Answering:
    async def aping(self, timeout_s: float | None = None) -> bool:
        return True


@pytest.mark.anyio
async def test_readyz_is_503_while_retained_writes_fail() -> None:
    broker = SimpleNamespace(retained_write_error="database is locked", retained_unwritten=3)
    response = await _app(cast(Storage, Answering()), broker).api.readyz(None)  # type: ignore[arg-type]
    assert response.status == 503
    assert b"failing (3 unwritten): database is locked" in response.body
    broker.retained_write_error = None
    response = await _app(cast(Storage, Answering()), broker).api.readyz(None)  # type: ignore[arg-type]
    assert response.status == 200


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
