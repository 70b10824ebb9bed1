from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import open_browser
from tests.support.postgres import PostgresCluster, find_bindir
from trimaran.mqtt.session import NO_BACKLOG

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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for every test that audits in this process (tests/analytics, and the
    crash series' audit in tests/queue): a JVM's start once per run, not once per audit."""
    pytest.importorskip("pyspark")
    from trimaran.analytics.source import DEBIAN_JARS, spark_session

    missing = [j for j in DEBIAN_JARS if not Path(j).exists()]
    if missing:
        pytest.skip(f"JDBC drivers missing: {missing} (scripts/system-deps.sh installs them)")
    session = spark_session(
        "local[2]",
        list(DEBIAN_JARS),
        app_name="trimaran-audit-tests",
        shuffle_partitions=1,  # tables of a few hundred rows: one task per stage is fastest
        extra={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.adaptive.enabled": "false",
            "spark.default.parallelism": "1",
            # Compiling generated code for every stage costs more than running it on tables of a
            # few hundred rows: interpreted evaluation (what Spark's own test suites also run) makes
            # each replay about a third faster here. The benchmark still runs with code generation.
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            # A JDBC table's size is unknown to Spark, which then assumes it huge and shuffles it for
            # every join; taking it as 1 MB lets these few-row tables be broadcast instead.
            "spark.sql.defaultSizeInBytes": str(1 << 20),
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A real headless Chromium (tests/support/browser.py); mark the test ``needs_browser``."""
    yield from open_browser()


@pytest.fixture(scope="session", autouse=True)
def no_backlog_stays_empty() -> Iterator[None]:
    """Every idle MQTT session shares ``NO_BACKLOG``: whatever the run did, nothing was written to it
    (a write would be every such session's)."""
    yield
    assert NO_BACKLOG.items is None and NO_BACKLOG.bytes == 0 and NO_BACKLOG.first_seq == 0
    assert NO_BACKLOG.next_seq == 0
