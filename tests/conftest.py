from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import open_browser
from tests.support.postgres import PostgresCluster, find_bindir

_db_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("TRIMARAN_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL binaries are missing and TRIMARAN_REQUIRE_POSTGRES is set")
        pytest.skip("PostgreSQL is not installed (Debian package 'postgresql')")
    cluster = PostgresCluster(bindir).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """A fresh, empty database per test."""
    return postgres_cluster.create_database(f"t{os.getpid()}_{next(_db_names)}")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each storage test runs against SQLite and a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'trimaran.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A real headless Chromium (tests/support/browser.py); mark the test ``needs_browser``."""
    yield from open_browser()
