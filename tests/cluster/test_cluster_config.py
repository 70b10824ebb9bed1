"""The [cluster] settings and what they refuse."""

from __future__ import annotations

import pytest

from trimaran.config import ConfigError, Settings, check_settings


def test_cluster_mode_on_sqlite_is_refused_in_one_line() -> None:
    settings = Settings(cluster={"enabled": True})
    with pytest.raises(ConfigError) as refused:
        check_settings(settings)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("invalid setting cluster.enabled: several nodes need one PostgreSQL")


def test_a_time_out_shorter_than_the_heartbeat_is_refused() -> None:
    settings = Settings(
        storage={"url": "postgresql://db/trimaran"},
        cluster={"enabled": True, "heartbeat_s": 5, "node_timeout_s": 2},
    )
    with pytest.raises(ConfigError, match=r"cluster\.node_timeout_s"):
        check_settings(settings)


def test_cluster_mode_on_postgresql_is_accepted() -> None:
    check_settings(Settings(storage={"url": "postgresql://db/trimaran"}, cluster={"enabled": True}))
