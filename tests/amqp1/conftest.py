"""AMQP 1.0 fixtures: the Qpid Proton C broker example as a reference peer (issue 22)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.proton_broker import build, proton_c_broker


@pytest.fixture(scope="session")
def proton_c_broker_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of a proton C broker example on 127.0.0.1; skipped with the reason when it cannot
    be built or run. Its queues live for the session: tests use their own addresses."""
    binary = build(tmp_path_factory.mktemp("proton-c-broker"))
    if isinstance(binary, str):
        pytest.skip(binary)
    try:
        with proton_c_broker(binary) as port:
            yield port
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["trimaran", "proton-c-broker"])
def amqp1_peer(request: pytest.FixtureRequest) -> int | None:
    """None for Trimaran (the test starts it in process), else the proton C broker's port: one test,
    both peers."""
    if request.param == "proton-c-broker":
        return int(request.getfixturevalue("proton_c_broker_port"))
    return None
