"""Raw-socket clients that load the in-process server for the per-message budgets.

Each speaks just enough of its protocol, with the project's own codecs, to run a closed loop: every
round, the publishers send a fixed batch in one write each, and the round ends when every message
has been delivered (and, where the path has them, acknowledged both ways). The clients run in the
test's thread, which is never profiled.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.support.budget import connect
from trimaran.amqp091 import spec
from trimaran.amqp091.frames import NEED_DATA as AMQP091_NEED_DATA
from trimaran.amqp091.frames import BodyFrame, FrameDecoder, HeaderFrame, MethodFrame, encode_content
from trimaran.amqp091.frames import encode_method as amqp091_method
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp1.frames import AMQP_HEADER, FRAME_AMQP, FRAME_SASL, SASL_HEADER, Frame, encode_frame
from trimaran.amqp1.frames import FrameDecoder as Amqp1Decoder
from trimaran.amqp1.messages import AmqpValue, Data, Header, Message, Properties, encode_message
from trimaran.amqp1.performatives import (
    SND_MIXED,
    SND_SETTLED,
    Accepted,
    Attach,
    Begin,
    Composite,
    Disposition,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from trimaran.amqp1.types import Int, ULong
from trimaran.mqtt.codec import NEED_DATA, Decoder, encode, encode_plain_publish
from trimaran.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionOptions,
)
from trimaran.mqtt.properties import Properties as MqttProperties

PAYLOAD = b"x" * 32
ALONE = MqttProperties(payload_format_indicator=0)  # a property: the PUBLISH is no run's


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(1 << 20)
    if not data:
        raise ConnectionError("the server closed the connection")
    return data


# -- MQTT --------------------------------------------------------------------------------------------


class MqttClient:
    def __init__(
        self,
        port: int,
        client_id: str,
        level: int = MQTT_5,
        username: str | None = None,
        receive_maximum: int | None = None,
    ) -> None:
        self.level = level
        self.sock = connect(port)
        self.decoder = Decoder(protocol_level=level)
        props = MqttProperties(receive_maximum=receive_maximum)
        connect_packet = Connect(
            protocol_level=level, client_id=client_id, username=username, properties=props
        )
        self.sock.sendall(encode(connect_packet, level))
        connack = self.expect()
        assert isinstance(connack, ConnAck) and connack.reason_code == 0, connack

    def packets(self) -> list[object]:
        self.decoder.feed(_recv(self.sock))
        out: list[object] = []
        while (packet := self.decoder.next_packet()) is not NEED_DATA:
            out.append(packet)
        return out

    def expect(self) -> object:
        while not (got := self.packets()):
            pass
        return got[0]

    def subscribe(self, topic_filter: str, qos: int) -> None:
        options = SubscriptionOptions(qos=qos)
        self.sock.sendall(encode(Subscribe(1, [(topic_filter, options)]), self.level))
        assert isinstance(self.expect(), SubAck)


class MqttLoad:
    """``publishers`` -> topic (or ``$queue/``) -> ``subscribers``, ``batch`` messages each a round;
    the subscribers on ``topic_filter`` (default: the topic), all logged in as ``username``."""

    def __init__(
        self,
        port: int,
        *,
        publishers: int,
        subscribers: int,
        qos: int,
        topic: str,
        batch: int,
        topic_filter: str | None = None,
        username: str | None = None,
        receive_maximum: int | None = None,
        topics: int = 1,
        alone: bool = False,
        paced: bool = False,
        commands: bool = False,
    ) -> None:
        self.qos = qos
        # paced: each publisher's batch delivered before the next publisher sends (devices a few
        # messages a second each): every read alone in its turn of the loop, whatever the host
        self.paced = paced
        # alone: each PUBLISH with a property, which no run takes (a message at a time)
        self.alone = alone
        # topics > 1: each message to the next of topic/0 .. topic/<topics-1>, so that no two
        # PUBLISHes in a row share a topic (a fleet's shape: the runs change topic, mqtt/codec.py)
        self.topics = [topic] if topics == 1 else [f"{topic}/{i}" for i in range(topics)]
        if topics > 1 and topic_filter is None:
            topic_filter = f"{topic}/+"
        self.batch = batch
        # receive_maximum: the subscribers' window; a small one keeps most deliveries queued
        self.subs = [
            MqttClient(port, f"sub{i}", username=username, receive_maximum=receive_maximum)
            for i in range(subscribers)
        ]
        for sub in self.subs:
            sub.subscribe(topic_filter or topic, qos)
        self.pubs = [MqttClient(port, f"pub{i}", username=username) for i in range(publishers)]
        if commands:  # each publisher also subscribed to its own commands (a device's shape)
            for i, pub in enumerate(self.pubs):
                pub.subscribe(f"commands/pub{i}", 1)
        self.topic = topic
        self.sent = 0

    def messages_per_round(self) -> int:
        return self.batch * len(self.pubs)

    def round(self) -> None:
        batches = []
        for _ in self.pubs:
            wire = bytearray()
            for i in range(self.batch):
                packet_id = (i % 65000) + 1 if self.qos else None
                topic = self.topics[i % len(self.topics)]
                if self.alone:
                    publish = Publish(topic, PAYLOAD, self.qos, packet_id=packet_id, properties=ALONE)
                    wire += encode(publish, MQTT_5)
                else:
                    wire += encode_plain_publish(topic, PAYLOAD, self.qos, False, False, packet_id, MQTT_5)
            batches.append(bytes(wire))
        if self.paced:
            for pub, batch in zip(self.pubs, batches, strict=True):
                pub.sock.sendall(batch)
                self._receive(self.batch * len(self.subs))
        else:
            for pub, batch in zip(self.pubs, batches, strict=True):
                pub.sock.sendall(batch)
            queue = self.topic.startswith("$queue/")
            # A queue message goes to one subscriber; a topic message to each of them.
            self._receive(self.messages_per_round() * (1 if queue else len(self.subs)))
        if self.qos:
            for pub in self.pubs:
                acked = 0
                while acked < self.batch:
                    acked += sum(isinstance(p, PubAck) for p in pub.packets())

    def _receive(self, expected: int) -> None:
        received = 0
        while received < expected:
            for sub in self.subs:
                sub.sock.settimeout(0.005 if len(self.subs) > 1 else 10)
                try:
                    got = sub.packets()
                except TimeoutError:
                    continue
                finally:
                    sub.sock.settimeout(10)
                acks = bytearray()
                for packet in got:
                    assert isinstance(packet, Publish), packet
                    received += 1
                    if packet.qos:
                        assert packet.packet_id is not None
                        acks += encode(PubAck(packet.packet_id), MQTT_5)
                if acks:
                    sub.sock.sendall(acks)

    def close(self) -> None:
        for client in [*self.pubs, *self.subs]:
            client.sock.close()


# -- AMQP 0.9.1 --------------------------------------------------------------------------------------


class Amqp091Client:
    def __init__(self, port: int, vhost: str = "/") -> None:
        self.sock = connect(port)
        self.decoder = FrameDecoder(131072)
        self.frames: list[object] = []
        self.sock.sendall(spec.PROTOCOL_HEADER)
        self.until(spec.ConnectionStart)
        self.send(spec.ConnectionStartOk({"product": "budget"}, "PLAIN", b"\x00guest\x00guest", "en_US"))
        self.until(spec.ConnectionTune)
        self.send(spec.ConnectionTuneOk(2047, 131072, 0))
        self.call(spec.ConnectionOpen(vhost), spec.ConnectionOpenOk, channel=0)
        self.call(spec.ChannelOpen(), spec.ChannelOpenOk, channel=1)

    def send(self, method: spec.Method, channel: int = 0) -> None:
        self.sock.sendall(amqp091_method(channel, method))

    def read(self) -> list[object]:
        self.decoder.feed(_recv(self.sock))
        out: list[object] = []
        while (frame := self.decoder.next_frame()) is not AMQP091_NEED_DATA:
            out.append(frame)
        return out

    def until(self, kind: type[spec.Method]) -> spec.Method:
        while True:
            for frame in self.read():
                if isinstance(frame, MethodFrame) and isinstance(frame.method, kind):
                    return frame.method
                assert not isinstance(frame, MethodFrame) or not isinstance(
                    frame.method, spec.ConnectionClose | spec.ChannelClose
                ), frame

    def call(self, method: spec.Method, answer: type[spec.Method], channel: int = 1) -> spec.Method:
        self.send(method, channel)
        return self.until(answer)


class Amqp091Load:
    """One publisher -> queue -> one consumer acking each delivery; durable: persistent messages
    with publisher confirms on a durable queue. ``no_ack``: the consumer takes deliveries in no-ack
    mode without a prefetch limit, as the benchmark's transient row does; ``ack_every``: the
    consumer acks every so many deliveries with one ``multiple`` ack, as its durable row does.
    ``keys``: published through a topic exchange, the routing key changing message to message, as
    the benchmark's amqp091-transient-keys row does."""

    def __init__(
        self,
        port: int,
        *,
        durable: bool,
        batch: int,
        vhost: str = "/",
        no_ack: bool = False,
        ack_every: int = 1,
        keys: int = 0,
    ) -> None:
        self.batch = batch
        self.durable = durable
        self.no_ack = no_ack
        self.ack_every = ack_every
        self.queue = "budget-durable" if durable else "budget-transient"
        self.pub = Amqp091Client(port, vhost)
        self.pub.call(spec.QueueDeclare(queue=self.queue, durable=durable), spec.QueueDeclareOk)
        exchange = ""
        if keys:
            exchange = "budget.topic"
            self.pub.call(spec.ExchangeDeclare(exchange=exchange, type="topic"), spec.ExchangeDeclareOk)
            bind = spec.QueueBind(queue=self.queue, exchange=exchange, routing_key=self.queue + ".#")
            self.pub.call(bind, spec.QueueBindOk)
        if durable:
            self.pub.call(spec.ConfirmSelect(), spec.ConfirmSelectOk)
        self.sub = Amqp091Client(port, vhost)
        if not no_ack:
            self.sub.call(spec.BasicQos(prefetch_count=batch * 2), spec.BasicQosOk)
        consume = spec.BasicConsume(queue=self.queue, consumer_tag="c", no_ack=no_ack)
        self.sub.call(consume, spec.BasicConsumeOk)
        props = BasicProperties(delivery_mode=2 if durable else None)
        publishes = [
            spec.BasicPublish(
                exchange=exchange, routing_key=f"{self.queue}.k{i % keys}" if keys else self.queue
            )
            for i in range(batch)
        ]
        self.wire = b"".join(encode_content(1, publish, props, PAYLOAD, 131072) for publish in publishes)
        self.confirmed = 0

    def messages_per_round(self) -> int:
        return self.batch

    def round(self) -> None:
        self.pub.sock.sendall(self.wire)
        delivered = 0
        acks = bytearray()  # one basic.ack a delivery, sent in one write when the round is in
        while delivered < self.batch:
            for frame in self.sub.read():
                if isinstance(frame, MethodFrame) and isinstance(frame.method, spec.BasicDeliver):
                    delivered += 1
                    tag = frame.method.delivery_tag
                    if not self.no_ack and not tag % self.ack_every:
                        acks += amqp091_method(1, spec.BasicAck(tag, self.ack_every > 1))
                else:
                    assert isinstance(frame, HeaderFrame | BodyFrame), frame
        if acks:
            self.sub.sock.sendall(acks)
        if self.durable:
            target = self.confirmed + self.batch
            while self.confirmed < target:
                for frame in self.pub.read():
                    assert isinstance(frame, MethodFrame) and isinstance(frame.method, spec.BasicAck), frame
                    tag = frame.method.delivery_tag
                    self.confirmed = tag if frame.method.multiple else max(self.confirmed, tag)

    def close(self) -> None:
        self.pub.sock.close()
        self.sub.sock.close()


# -- AMQP 1.0 ----------------------------------------------------------------------------------------


class Amqp1Client:
    def __init__(self, port: int, container_id: str) -> None:
        self.sock = connect(port)
        self.decoder = Amqp1Decoder()
        self.header = True  # the server answers a protocol header with its own before any frame
        self.sock.sendall(SASL_HEADER)
        self.until(SaslMechanisms)
        self.sock.sendall(bytes(encode_frame(FRAME_SASL, 0, SaslInit(mechanism="ANONYMOUS"))))
        self.until(SaslOutcome)
        self.header = True
        self.sock.sendall(AMQP_HEADER)
        self.send(Open(container_id=container_id))
        self.until(Open)
        self.send(Begin(next_outgoing_id=0, incoming_window=100_000, outgoing_window=100_000))
        self.until(Begin)

    def send(self, perf: Composite, payload: bytes = b"") -> None:
        self.sock.sendall(bytes(encode_frame(FRAME_AMQP, 0, perf, payload)))

    def read(self) -> list[Composite]:
        self.decoder.feed(_recv(self.sock))
        out: list[Composite] = []
        while True:
            if self.header:
                if not isinstance(self.decoder.next_header(), bytes):
                    return out
                self.header = False
            frame = self.decoder.next_frame()
            if not isinstance(frame, Frame):
                return out
            if not frame.is_empty:
                out.append(frame.performative()[0])

    def until(self, kind: type[Composite]) -> Composite:
        while True:
            for perf in self.read():
                if isinstance(perf, kind):
                    return perf


class Amqp1Load:
    """One sender -> a transient queue (declared over AMQP 0.9.1 first) -> one receiver, both
    unsettled: the server accepts each transfer, the receiver accepts each delivery. Durable: a
    durable queue and messages whose header says durable, accepted only after the commit (the
    bench's amqp1-durable row). Settled: pre-settled transfers both ways, no disposition either way
    (the bench's amqp1-settled row, AMQP 0.9.1 no-ack without confirms' twin)."""

    def __init__(
        self,
        port: int,
        *,
        batch: int,
        like_proton_c: bool = False,
        durable: bool = False,
        settled: bool = False,
    ) -> None:
        self.batch = batch
        self.like_proton_c = like_proton_c
        self.settled = settled
        queue = (
            "budget-amqp1-c"
            if like_proton_c
            else "budget-amqp1-d"
            if durable
            else "budget-amqp1-s"
            if settled
            else "budget-amqp1"
        )
        snd_settle_mode = SND_SETTLED if settled else SND_MIXED
        declare = Amqp091Client(port)
        declare.call(spec.QueueDeclare(queue=queue, durable=durable), spec.QueueDeclareOk)
        declare.sock.close()
        self.sender = Amqp1Client(port, "budget-sender")
        self.sender.send(
            Attach(
                name="s",
                handle=0,
                role=False,
                snd_settle_mode=snd_settle_mode,
                source=Source(),
                target=Target(address=queue),
                initial_delivery_count=0,
            )
        )
        self.sender_credit = self._credit(self.sender.until(Flow))  # type: ignore[arg-type]
        self.receiver = Amqp1Client(port, "budget-receiver")
        self.receiver.send(
            Attach(
                name="r",
                handle=0,
                role=True,
                snd_settle_mode=snd_settle_mode,
                source=Source(address=queue),
                target=Target(),
            )
        )
        self.receiver.until(Attach)
        self.credit = 0
        self.delivery_id = 0
        header = Header(durable=True) if durable else None
        self.body = encode_message(Message(header=header, body=[Data(PAYLOAD)]))
        self.accepted = 0
        if like_proton_c:
            # receive.c grants the whole count's credit once and never again
            self.receiver.send(
                Flow(
                    incoming_window=0x7FFFFFFF,
                    next_outgoing_id=0,
                    outgoing_window=0x7FFFFFFF,
                    handle=0,
                    delivery_count=0,
                    link_credit=1_000_000,
                )
            )

    def messages_per_round(self) -> int:
        return self.batch

    def _grant(self, delivered: int) -> None:
        self.receiver.send(
            Flow(
                next_incoming_id=delivered,
                incoming_window=100_000,
                next_outgoing_id=0,
                outgoing_window=100_000,
                handle=0,
                delivery_count=delivered,
                link_credit=self.batch * 2,
            )
        )

    @staticmethod
    def _credit(flow: Flow) -> int:
        """The delivery id up to which the server lets the sender transfer."""
        return (flow.delivery_count or 0) + (flow.link_credit or 0)

    def round(self) -> None:
        if self.like_proton_c:
            self._round_like_proton_c()
            return
        first = self.delivery_id
        if self.settled:
            while self.sender_credit < first + self.batch:
                self._sender_read()
        wire = bytearray()
        for i in range(self.batch):
            tag = (first + i).to_bytes(8, "big")
            wire += encode_frame(
                FRAME_AMQP,
                0,
                Transfer(
                    handle=0,
                    delivery_id=first + i,
                    delivery_tag=tag,
                    message_format=0,
                    settled=self.settled or None,
                ),
                self.body,
            )
        self.delivery_id += self.batch
        if first == 0:
            self._grant(0)
        self.sender.sock.sendall(bytes(wire))
        received: list[int] = []
        while len(received) < self.batch:
            ids = [p.delivery_id or 0 for p in self.receiver.read() if isinstance(p, Transfer)]
            received += ids
            if ids and not self.settled:
                self.receiver.send(
                    Disposition(role=True, first=ids[0], last=ids[-1], settled=True, state=Accepted())
                )
        self._grant(self.delivery_id)
        if self.settled:
            return  # nothing comes back to the sender but credit, read before the next round
        while self.accepted < self.delivery_id:
            for perf in self.sender.read():
                if isinstance(perf, Disposition):
                    self.accepted = max(
                        self.accepted, (perf.last if perf.last is not None else perf.first) + 1
                    )

    def _round_like_proton_c(self) -> None:
        """proton's C send.c / receive.c: send.c transfers unsettled as far as the server's credit goes
        and counts the server's accepted outcomes; receive.c accepts and settles each delivery on its
        own (one disposition each, first only; the proton engine puts a read's worth in one write)."""
        first = self.delivery_id
        end = first + self.batch
        while self.delivery_id < end:
            while self.sender_credit <= self.delivery_id:
                self._sender_read()
            upto = min(end, self.sender_credit)
            wire = bytearray()
            for i in range(self.delivery_id, upto):
                message = encode_message(
                    Message(
                        header=Header(),
                        properties=Properties(message_id=ULong(i)),  # as send.c: a ulong id
                        body=[AmqpValue({"sequence": Int(i)})],
                    )
                )
                wire += encode_frame(
                    FRAME_AMQP,
                    0,
                    Transfer(handle=0, delivery_id=i, delivery_tag=i.to_bytes(4, "little"), message_format=0),
                    message,
                )
            self.delivery_id = upto
            self.sender.sock.sendall(bytes(wire))
        received = 0
        while received < self.batch:
            wire = bytearray()
            for perf in self.receiver.read():
                if isinstance(perf, Transfer):
                    received += 1
                    wire += encode_frame(
                        FRAME_AMQP,
                        0,
                        Disposition(role=True, first=perf.delivery_id, settled=True, state=Accepted()),
                    )
            if wire:
                self.receiver.sock.sendall(bytes(wire))
        while self.accepted < self.delivery_id:
            self._sender_read()

    def _sender_read(self) -> None:
        for perf in self.sender.read():
            if isinstance(perf, Disposition):
                self.accepted = max(self.accepted, (perf.last if perf.last is not None else perf.first) + 1)
            elif isinstance(perf, Flow) and perf.handle is not None:
                self.sender_credit = self._credit(perf)

    def close(self) -> None:
        self.sender.sock.close()
        self.receiver.sock.close()


Load = MqttLoad | Amqp091Load | Amqp1Load
LoadFactory = Callable[[int, int], Load]
