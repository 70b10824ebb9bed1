"""A bridge under faults (trimaran/bridges/mqtt.py): the network cut, this server restarted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.bridges.test_mqtt_bridge import bridged, local_client, remote_client
from tests.support.mosquitto import running_mosquitto
from tests.support.paho import Client
from tests.support.proxy import Proxy, proxy_to
from tests.support.server import RunningServer

COUNT = 300  # each way; Mosquitto queues up to 1,000 for the bridge while it is away


def _publish_steadily(client: Client, prefix: str, acked: list[str]) -> None:
    for i in range(COUNT):
        payload = f"{prefix}{i}"
        client.publish(f"{prefix}{i}", payload.encode(), qos=1)  # waits for its PUBACK
        acked.append(payload)
        time.sleep(0.002)


def _collect(client: Client, expected: set[str], timeout: float) -> Counter[str]:
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while not expected <= set(seen) and time.monotonic() < deadline:
        try:
            seen[client.expect(0.5).payload.decode()] += 1
        except Exception:  # queue.Empty: look at the deadline again
            continue
    return seen


def _stream_both_ways(server: RunningServer, remote_port: int, fault: object) -> None:
    """COUNT messages each way at QoS 1 while ``fault()`` runs; every acknowledged one arrives."""
    collector = remote_client(remote_port, "collector", clean=False)
    collector.subscribe("up/#", 1)
    device = local_client(server, "device", clean=False)
    device.subscribe("down/#", 1)
    local_pub = local_client(server, "sensor")
    remote_pub = remote_client(remote_port, "commander")
    acked_up: list[str] = []
    acked_down: list[str] = []
    publishers = [
        threading.Thread(target=_publish_steadily, args=(local_pub, "up/", acked_up)),
        threading.Thread(target=_publish_steadily, args=(remote_pub, "down/", acked_down)),
    ]
    for thread in publishers:
        thread.start()
    fault()  # type: ignore[operator]
    for thread in publishers:
        thread.join(120)
    up = _collect(collector, set(acked_up), 60)
    down = _collect(device, set(acked_down), 60)
    assert len(acked_up) == len(acked_down) == COUNT
    assert set(acked_up) - set(up) == set(), "acknowledged here, never arrived there"
    assert set(acked_down) - set(down) == set(), "acknowledged there, never arrived here"
    duplicates = sum(up.values()) - len(up) + sum(down.values()) - len(down)
    print(f"duplicates (QoS 1 allows them): {duplicates}")
    for client in (collector, device, local_pub, remote_pub):
        client.disconnect()


@pytest.mark.parametrize("protocol", ["mqttv311", pytest.param("mqttv50", marks=pytest.mark.slow)])
def test_a_network_reset_ten_times_loses_nothing_either_way(tmp_path: Path, protocol: str) -> None:
    with running_mosquitto(tmp_path) as port, proxy_to(port) as proxy:
        topics = ["up/# out 1", "down/# in 1"]
        with bridged(tmp_path / "t", proxy.port, topics, bridge_protocol_version=protocol) as server:

            def cut_ten_times() -> None:
                for _ in range(10):
                    time.sleep(0.25)
                    proxy.reset()

            _stream_both_ways(server, port, cut_ten_times)
            # (A reset while the bridge waits to reconnect finds no connection to cut.)
            assert server.output().count("bridge cloud: connected") >= 6


@pytest.mark.slow
def test_a_network_gone_quiet_is_found_by_the_keep_alive(tmp_path: Path) -> None:
    with running_mosquitto(tmp_path) as port, proxy_to(port) as proxy:
        topics = ["up/# out 1", "down/# in 1"]
        with bridged(tmp_path / "t", proxy.port, topics, keepalive_interval=1) as server:

            def go_quiet(proxy: Proxy = proxy) -> None:
                time.sleep(0.3)
                proxy.silence()
                assert server.wait_for_log("no answer from the remote within the keep-alive", 10)
                proxy.heal()

            _stream_both_ways(server, port, go_quiet)


def test_messages_queued_for_an_absent_remote_outlive_a_restart_here(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    with running_mosquitto(remote_dir, persistence=True) as port:
        keeper = remote_client(port, "keeper", clean=False)
        keeper.subscribe("cloud/#", 1)
        keeper.disconnect()
    here = tmp_path / "t"
    with bridged(here, port, ["# out 1 edge/ cloud/"], connected=False) as server:
        local = local_client(server, "device")
        for i in range(50):
            local.publish(f"edge/r/{i}", str(i).encode(), qos=1, retain=i == 49)
        local.disconnect()
    with (
        running_mosquitto(remote_dir, port=port, persistence=True),
        bridged(here, port, ["# out 1 edge/ cloud/"]),
    ):
        keeper = remote_client(port, "keeper", clean=False)
        got = keeper.drain(50)
        assert sorted(int(m.payload) for m in got) == list(range(50))
        keeper.expect_none(0.5)
        keeper.disconnect()
        late = remote_client(port, "late")
        late.subscribe("cloud/r/#", 1)
        retained = late.expect()
        assert (retained.topic, retained.payload, retained.retain) == ("cloud/r/49", b"49", True)
        late.disconnect()


def test_a_restart_here_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """This server stopped (SIGTERM) while QoS 1 messages stream out: what it acknowledged before
    arrives at the remote once it is back, whatever was in flight or queued at the stop."""
    here = tmp_path / "t"
    with running_mosquitto(tmp_path) as port:
        collector = remote_client(port, "collector", clean=False)
        collector.subscribe("up/#", 1)
        acked: list[str] = []
        with bridged(here, port, ["up/# out 1"]) as server:
            sensor = local_client(server, "sensor")

            def publish() -> None:
                for i in range(COUNT):
                    try:
                        sensor.publish(f"up/{i}", str(i).encode(), qos=1)
                    except (AssertionError, RuntimeError):  # the server went: not acknowledged
                        return
                    acked.append(str(i))

            # (A daemon: the publish the stop cut waits out paho's own time-out, acknowledging nothing.)
            threading.Thread(target=publish, daemon=True).start()
            while len(acked) < COUNT // 2:
                time.sleep(0.01)
        done = set(acked)  # the server is gone: nothing more is acknowledged
        assert COUNT // 2 <= len(done) < COUNT
        with bridged(here, port, ["up/# out 1"]):
            seen = _collect(collector, done, 30)
        assert done - set(seen) == set(), "acknowledged here, never arrived there"
        collector.disconnect()


@pytest.mark.slow
def test_the_remote_restarted_ten_times_loses_nothing_either_way(tmp_path: Path) -> None:
    """Mosquitto (keeping its sessions on disk) stopped and started again ten times while QoS 1
    messages go both ways: what one side acknowledged arrives on the other."""
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    with running_mosquitto(remote_dir, persistence=True) as port:
        collector = remote_client(port, "collector", clean=False)
        collector.subscribe("up/#", 1)
        collector.disconnect()
        server_cm = bridged(tmp_path / "t", port, ["up/# out 1", "down/# in 1"])
        server = server_cm.__enter__()
    try:
        device = local_client(server, "device", clean=False)
        device.subscribe("down/#", 1)
        sensor = local_client(server, "sensor")
        acked_up: list[str] = []
        acked_down: list[str] = []
        for turn in range(10):
            for i in range(20):  # the remote away: held here
                sensor.publish(f"up/{turn}/{i}", f"up {turn} {i}".encode(), qos=1)
                acked_up.append(f"up {turn} {i}")
            with running_mosquitto(remote_dir, port=port, persistence=True):
                commander = remote_client(port, f"commander-{turn}")
                for i in range(20):
                    commander.publish(f"down/{turn}/{i}", f"down {turn} {i}".encode(), qos=1)
                    acked_down.append(f"down {turn} {i}")
                    sensor.publish(f"up/{turn}/live-{i}", f"up {turn} live {i}".encode(), qos=1)
                    acked_up.append(f"up {turn} live {i}")
                commander.disconnect()
                time.sleep(0.2)
        with running_mosquitto(remote_dir, port=port, persistence=True):
            collector = remote_client(port, "collector", clean=False)
            up = _collect(collector, set(acked_up), 30)
            down = _collect(device, set(acked_down), 30)
            collector.disconnect()
        assert set(acked_up) - set(up) == set(), "acknowledged here, never arrived there"
        assert set(acked_down) - set(down) == set(), "acknowledged there, never arrived here"
        assert server.output().count("bridge cloud: connected") >= 11
        device.disconnect()
        sensor.disconnect()
    finally:
        server_cm.__exit__(None, None, None)
