"""trimaran/vhosts.py: names, the key scheme and the registry."""

from __future__ import annotations

import anyio
import pytest

from trimaran.vhosts import (
    DEFAULT_VHOST,
    VHostError,
    VHosts,
    dead_letter_name,
    is_reserved,
    prefix,
    split_key,
    split_user,
    strip,
    validate_name,
    vhost_of,
)


def test_the_default_vhost_has_no_prefix_so_its_keys_are_the_names() -> None:
    assert prefix(DEFAULT_VHOST) == ""
    assert split_key("sensors/1") == ("/", "sensors/1")
    assert dead_letter_name("orders") == "$dlq/orders"


@pytest.mark.parametrize("vhost", ["prod", "prod/eu", "a+b#c", "$SYS", "ü ÿ", "%2F", "x:y"])
def test_a_prefix_is_two_topic_levels_and_splits_back(vhost: str) -> None:
    p = prefix(vhost)
    assert p.startswith("$vhost/") and p.count("/") == 2
    assert not set(p[len("$vhost/") : -1]) & {"/", "+", "#"}
    for name in ("orders", "a/b/c", "$queue/q", ""):
        assert split_key(p + name) == (vhost, name)
        assert vhost_of(p + name) == vhost
        assert strip(p + name, p) == name
    assert split_key(dead_letter_name(p + "orders")) == (vhost, "$dlq/orders")


def test_prefixes_of_different_vhosts_never_overlap() -> None:
    names = ["a", "a/b", "a%2Fb", "ab", "/", "//"]
    prefixes = [prefix(n) for n in names]
    assert len(set(prefixes)) == len(names)
    for one in prefixes:
        for other in prefixes:
            assert one == other or not (one and other.startswith(one))


def test_reserved_names_are_the_tenant_ones() -> None:
    assert is_reserved("$vhost/x/y") and is_reserved("$vhost")
    assert not is_reserved("$vhostx/y") and not is_reserved("vhost/x") and not is_reserved("$SYS/x")


@pytest.mark.parametrize("bad", ["", "a\x00b", "tab\there", "x" * 256, "é" * 128])
def test_invalid_names_are_refused(bad: str) -> None:
    with pytest.raises(VHostError):
        validate_name(bad)


def test_rabbitmq_mqtt_user_names_name_a_vhost() -> None:
    assert split_user("prod:alice") == ("prod", "alice")
    assert split_user("prod/eu:al:ice") == ("prod/eu", "al:ice")
    assert split_user("alice") == (None, "alice")
    assert split_user(":alice") == (None, ":alice")
    assert split_user("prod:") == (None, "prod:")
    assert split_user(None) == (None, None)


class _Rows:
    def __init__(self) -> None:
        self.rows: set[str] = {"kept"}

    async def load_vhosts(self) -> list[str]:
        return sorted(self.rows)

    async def save_vhost(self, name: str) -> None:
        self.rows.add(name)

    async def delete_vhost(self, name: str) -> None:
        self.rows.discard(name)


def test_the_registry_adds_persists_and_deletes_with_the_contents() -> None:
    async def main() -> None:
        rows = _Rows()
        vhosts = VHosts(["declared"], rows)
        assert vhosts.names() == ["/", "declared"]
        await vhosts.load()
        assert vhosts.exists("kept") and vhosts.exists("/") and not vhosts.exists("nope")
        emptied: list[str] = []

        async def empty(name: str) -> None:
            assert not vhosts.exists(name)  # nobody enters while it is emptied
            emptied.append(name)

        vhosts.on_delete(empty)
        assert await vhosts.add("new") and not await vhosts.add("new")
        assert "new" in rows.rows and vhosts.names() == ["/", "declared", "kept", "new"]
        assert await vhosts.delete("new") and emptied == ["new"] and "new" not in rows.rows
        assert not await vhosts.delete("new")
        with pytest.raises(VHostError):
            await vhosts.delete("/")
        with pytest.raises(VHostError):
            await vhosts.delete("declared")
        with pytest.raises(VHostError):
            await vhosts.add("bad\x00")

    anyio.run(main)


def test_the_dollar_rule_holds_at_a_tenants_first_level() -> None:
    from trimaran.broker.message import Message
    from trimaran.broker.retained import RetainedStore
    from trimaran.broker.router import Router, SubscriptionOptions
    from trimaran.topics import topic_matches

    class Sub:
        def __init__(self, name: str) -> None:
            self.id = name

    t = prefix("t")
    router: Router[Sub] = Router()
    everything, tenant_all, tenant_plus, tenant_sys = Sub("/#"), Sub("t#"), Sub("t+"), Sub("t$SYS")
    router.subscribe(everything, "#", SubscriptionOptions())
    router.subscribe(tenant_all, t + "#", SubscriptionOptions())
    router.subscribe(tenant_plus, t + "+/x", SubscriptionOptions())
    router.subscribe(tenant_sys, t + "$SYS/#", SubscriptionOptions())

    def who(topic: str) -> set[str]:
        return {d.subscriber.id for d in router.match(topic)}

    assert who("a/x") == {"/#"}
    assert who(t + "a/x") == {"t#", "t+"}
    assert who(t + "$SYS/x") == {"t$SYS"}
    assert who(t + "$SYS") == {"t$SYS"}
    for f, topic, expected in [
        (t + "#", t + "a", True),
        (t + "#", t + "$SYS/a", False),
        (t + "+/a", t + "$x/a", False),
        (t + "$x/#", t + "$x/a", True),
        ("#", t + "a", False),
        (prefix("u") + "#", t + "a", False),
    ]:
        assert topic_matches(f, topic) is expected, (f, topic)
    retained = RetainedStore()
    for topic in ("a/x", t + "a/x", t + "$SYS/x", prefix("u") + "a/x"):
        retained.set(Message(topic=topic, payload=b"1", retain=True))
    assert {m.topic for m in retained.match("#")} == {"a/x"}
    assert {m.topic for m in retained.match(t + "#")} == {t + "a/x"}
    assert {m.topic for m in retained.match(t + "+/x")} == {t + "a/x"}
    assert {m.topic for m in retained.match(t + "$SYS/+")} == {t + "$SYS/x"}
