"""A synchronous wrapper around paho-mqtt 2.x for interop tests: connect, wait, collect."""

from __future__ import annotations

import contextlib
import queue
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

V311 = MQTTProtocolVersion.MQTTv311
V5 = MQTTProtocolVersion.MQTTv5
V31 = MQTTProtocolVersion.MQTTv31


@dataclass
class Endpoints:
    host: str
    tcp: int
    tls: int | None = None
    ws: int | None = None
    wss: int | None = None
    ca_file: str | None = None


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Any
    mid: int = 0
    dup: bool = False


@dataclass
class Client:
    """One paho client running its network loop in a thread."""

    client: mqtt.Client
    version: MQTTProtocolVersion
    messages: queue.Queue[Received] = field(default_factory=queue.Queue)
    connack: queue.Queue[tuple[Any, Any, Any]] = field(default_factory=queue.Queue)
    disconnects: queue.Queue[Any] = field(default_factory=queue.Queue)
    subacks: queue.Queue[tuple[int, list[Any]]] = field(default_factory=queue.Queue)
    acks: dict[int, threading.Event] = field(default_factory=dict)

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        wait: bool = True,
    ) -> mqtt.MQTTMessageInfo:
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if wait and qos > 0:
            info.wait_for_publish(10)
            assert info.is_published(), f"publish to {topic} not acknowledged"
        return info

    def subscribe(
        self, topic: str, qos: int = 0, properties: Properties | None = None, **options: Any
    ) -> list[Any]:
        if self.version == V5:
            opts = SubscribeOptions(qos=qos, **options)
            result, mid = self.client.subscribe(topic, options=opts, properties=properties)
        else:
            result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        got_mid, codes = self.subacks.get(timeout=10)
        assert got_mid == mid
        return codes

    def unsubscribe(self, topic: str) -> None:
        self.client.unsubscribe(topic)

    def expect(self, timeout: float = 5.0) -> Received:
        return self.messages.get(timeout=timeout)

    def expect_none(self, wait: float = 0.5) -> None:
        try:
            extra = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {extra.topic}: {extra.payload!r}")

    def drain(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        out: list[Received] = []
        while len(out) < count:
            out.append(self.messages.get(timeout=max(0.01, deadline - time.monotonic())))
        return out

    def disconnect(self, properties: Properties | None = None, reasoncode: Any = None) -> None:
        if reasoncode is not None:
            self.client.disconnect(reasoncode=reasoncode, properties=properties)
        else:
            self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT: an abnormal disconnect (wills fire)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()


def connect(
    endpoints: Endpoints,
    client_id: str = "",
    *,
    version: MQTTProtocolVersion = V311,
    transport: str = "tcp",
    clean: bool = True,
    properties: Properties | None = None,
    will: tuple[str, bytes, int, bool] | None = None,
    will_properties: Properties | None = None,
    username: str | None = None,
    password: str | None = None,
    keepalive: int = 30,
    manual_ack: bool = False,
    expect_success: bool = True,
    max_inflight: int = 20,
) -> Client:
    kwargs: dict[str, Any] = {}
    if version != V5:
        kwargs["clean_session"] = clean
    paho = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=version,
        transport="websockets" if transport in ("ws", "wss") else "tcp",
        reconnect_on_failure=False,
        manual_ack=manual_ack,
        **kwargs,
    )
    client = Client(paho, version)
    paho.max_inflight_messages_set(max_inflight)  # QoS 1/2 publishes unacknowledged at once
    port = endpoints.tcp
    if transport in ("tls", "wss"):
        context = ssl.create_default_context(cafile=endpoints.ca_file)
        paho.tls_set_context(context)
        port = endpoints.tls if transport == "tls" else endpoints.wss  # type: ignore[assignment]
    elif transport == "ws":
        port = endpoints.ws  # type: ignore[assignment]
    if transport in ("ws", "wss"):
        paho.ws_set_options(path="/mqtt")
    if will is not None:
        paho.will_set(*will, properties=will_properties)
    if username is not None:
        paho.username_pw_set(username, password)

    def on_connect(_c: Any, _u: Any, flags: Any, reason: Any, props: Any) -> None:
        client.connack.put((flags, reason, props))

    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        client.messages.put(
            Received(
                msg.topic,
                bytes(msg.payload),
                msg.qos,
                bool(msg.retain),
                getattr(msg, "properties", None),
                msg.mid,
                bool(msg.dup),
            )
        )

    def on_subscribe(_c: Any, _u: Any, mid: int, codes: list[Any], _p: Any) -> None:
        client.subacks.put((mid, codes))

    def on_disconnect(_c: Any, _u: Any, _flags: Any, reason: Any, props: Any) -> None:
        client.disconnects.put((reason, props))

    paho.on_connect = on_connect
    paho.on_message = on_message
    paho.on_subscribe = on_subscribe
    paho.on_disconnect = on_disconnect
    if version == V5:
        paho.connect(endpoints.host, port, keepalive=keepalive, clean_start=clean, properties=properties)
    else:
        paho.connect(endpoints.host, port, keepalive=keepalive)
    paho.loop_start()
    flags, reason, props = client.connack.get(timeout=10)
    if expect_success:
        assert not reason.is_failure, f"CONNACK {reason}"
    client.connack.put((flags, reason, props))
    return client


def user_props(message: Received) -> dict[str, str]:
    """A message's MQTT 5 user properties as a dict (empty for 3.1.1 or when it has none)."""
    return dict(getattr(message.properties, "UserProperty", None) or [])


def watch_pubacks(client: Client) -> dict[int, int]:
    """mid -> PUBACK reason code, filled by paho's on_publish from now on."""
    codes: dict[int, int] = {}

    def on_publish(_c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        codes[mid] = getattr(reason, "value", 0)

    client.client.on_publish = on_publish
    return codes


def close_all(*clients: Client) -> None:
    """Disconnect every client, ignoring the ones already gone (dropped or closed by the server)."""
    for c in clients:
        with contextlib.suppress(Exception):
            c.disconnect()


def props(packet: int = PacketTypes.PUBLISH, **values: Any) -> Properties:
    """Build paho Properties: props(PacketTypes.CONNECT, SessionExpiryInterval=60)."""
    p = Properties(packet)  # type: ignore[no-untyped-call]
    for name, value in values.items():
        setattr(p, name, value)
    return p


__all__ = [
    "V5",
    "V31",
    "V311",
    "Client",
    "Endpoints",
    "PacketTypes",
    "Properties",
    "Received",
    "close_all",
    "connect",
    "props",
    "user_props",
    "watch_pubacks",
]
