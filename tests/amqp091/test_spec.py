import dataclasses

import pytest

from trimaran.amqp091 import spec


def test_method_table_is_complete() -> None:
    names = set(spec.METHODS_BY_NAME)
    expected = {
        "connection": "start start-ok secure secure-ok tune tune-ok open open-ok close close-ok blocked "
        "unblocked update-secret update-secret-ok",
        "channel": "open open-ok flow flow-ok close close-ok",
        "exchange": "declare declare-ok delete delete-ok bind bind-ok unbind unbind-ok",
        "queue": "declare declare-ok bind bind-ok purge purge-ok delete delete-ok unbind unbind-ok",
        "basic": "qos qos-ok consume consume-ok cancel cancel-ok publish return deliver get get-ok get-empty "
        "ack reject recover-async recover recover-ok nack",
        "confirm": "select select-ok",
        "tx": "select select-ok commit commit-ok rollback rollback-ok",
    }
    assert names == {f"{cls}.{m}" for cls, ms in expected.items() for m in ms.split()}
    for cls in spec.METHODS.values():
        assert spec.CLASS_NAMES[cls.CLASS_ID] == cls.NAME.split(".")[0]
        assert cls.INDEX == cls.CLASS_ID << 16 | cls.METHOD_ID


@pytest.mark.parametrize(
    ("name", "ids"),
    [
        ("connection.update-secret", (10, 70)),
        ("connection.blocked", (10, 60)),
        ("exchange.unbind-ok", (40, 51)),  # not 41
        ("basic.recover-async", (60, 100)),
        ("basic.nack", (60, 120)),
        ("confirm.select", (85, 10)),
        ("tx.rollback-ok", (90, 31)),
    ],
)
def test_ids(name: str, ids: tuple[int, int]) -> None:
    cls = spec.METHODS_BY_NAME[name]
    assert ids == (cls.CLASS_ID, cls.METHOD_ID)


def test_synchronous_methods_and_replies() -> None:
    assert spec.QueueDeclare.SYNCHRONOUS and (spec.QueueDeclareOk,) == spec.QueueDeclare.RESPONSES
    assert (spec.BasicGetOk, spec.BasicGetEmpty) == spec.BasicGet.RESPONSES
    assert not spec.BasicPublish.SYNCHRONOUS and spec.BasicPublish.RESPONSES == ()
    for cls in spec.METHODS.values():
        assert bool(cls.RESPONSES) == cls.SYNCHRONOUS
        for reply in cls.RESPONSES:
            assert reply.CLASS_ID == cls.CLASS_ID and not reply.SYNCHRONOUS


def test_content_methods() -> None:
    content = {c.NAME for c in spec.METHODS.values() if c.HAS_CONTENT}
    assert content == {"basic.publish", "basic.return", "basic.deliver", "basic.get-ok"}


def test_fields_and_domains() -> None:
    assert spec.BasicPublish.FIELDS == (
        ("reserved_1", "reserved-1", "short"),
        ("exchange", "exchange", "shortstr"),
        ("routing_key", "routing-key", "shortstr"),
        ("mandatory", "mandatory", "bit"),
        ("immediate", "immediate", "bit"),
    )
    assert spec.BasicQos.FIELDS[-1] == ("global_", "global", "bit")
    assert spec.ConnectionStart.FIELDS[2] == ("server_properties", "server-properties", "table")


def test_dataclass_defaults_and_slots() -> None:
    m = spec.BasicPublish(exchange="", routing_key="", mandatory=False, immediate=False)
    assert m == spec.BasicPublish()
    assert not hasattr(m, "__dict__")
    a, b = spec.QueueDeclare(), spec.QueueDeclare()
    assert a.arguments is not b.arguments


_SAMPLE = {"octet": 7, "short": 300, "long": 70000, "longlong": 1 << 40, "timestamp": 1 << 33}
_SAMPLE.update({"shortstr": "s", "longstr": b"l", "bit": True, "table": {"k": 1}})


@pytest.mark.parametrize("cls", list(spec.METHODS.values()), ids=lambda c: c.NAME)
def test_arguments_in_wire_order_and_defaults(cls: type[spec.Method]) -> None:
    # The methods whose __init__ is written out (and every other) take their fields in wire order.
    values = [_SAMPLE[domain] for _attr, _wire, domain in cls.FIELDS]
    method = cls(*values)
    assert [getattr(method, attr) for attr, _wire, _domain in cls.FIELDS] == values
    assert spec.decode_method(cls.INDEX.to_bytes(4, "big") + method.encode_arguments()) == method
    defaults = cls()
    for f in dataclasses.fields(defaults):  # type: ignore[arg-type]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        assert getattr(defaults, f.name) == default


def test_bits_packed_in_one_octet() -> None:
    m = spec.QueueDeclare(
        queue="", passive=True, durable=False, exclusive=True, auto_delete=False, no_wait=True
    )
    # reserved short, empty shortstr, one octet of bits (1 + 4 + 16), empty table
    assert m.encode_arguments() == b"\x00\x00" + b"\x00" + b"\x15" + b"\x00\x00\x00\x00"
    assert spec.decode_method(b"\x00\x32\x00\x0a" + m.encode_arguments()) == m


@pytest.mark.parametrize(
    ("code", "hard"),
    [
        (200, False),
        (311, False),
        (312, False),
        (313, False),
        (320, True),
        (402, True),
        (403, False),
        (404, False),
        (405, False),
        (406, False),
        (501, True),
        (502, True),
        (503, True),
        (504, True),
        (505, True),
        (506, False),
        (530, True),
        (540, True),
        (541, True),
    ],
)
def test_reply_codes(code: int, hard: bool) -> None:
    assert spec.REPLY_CODES[code].connection is hard
    assert spec.is_connection_exception(code) is hard
    assert spec.ProtocolError(code, "x", channel=1).connection_exception is hard


def test_error_text() -> None:
    err = spec.ProtocolError(spec.NOT_FOUND, "no queue 'q'", channel=3, class_id=50, method_id=10)
    assert err.full_text == "NOT_FOUND - no queue 'q'"
    assert "404" in str(err)
    assert len(spec.ProtocolError(404, "x" * 400).full_text) == 255


def test_encode_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        spec.BasicAck(delivery_tag=-1).encode_arguments()
