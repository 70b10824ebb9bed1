"""Transient queues' own path (trimaran/queue/transient.py): in memory, never through the journal."""

from __future__ import annotations

from typing import Any, NoReturn

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message, now_ms
from trimaran.compiled import compiled_modules
from trimaran.config import QueuePolicySettings
from trimaran.queue import QueueManager
from trimaran.queue.outcomes import ACK, RETRY_NOW

pytestmark = pytest.mark.anyio


def msg(payload: bytes, **kw: Any) -> Message:
    return Message(topic="$queue/t", payload=payload, qos=1, **kw)


def no_journal(manager: QueueManager) -> None:
    """Any row, event or submission for the journal fails the test. Compiled by mypyc, the journal's
    methods cannot be replaced (and compiled callers would not look them up): the interpreted run
    (TRIMARAN_INTERPRETED=1) checks this; the compiled one checks the rest."""
    if "trimaran.queue.journal" in compiled_modules():
        return

    def refuse(*_args: object, **_kw: object) -> NoReturn:
        raise AssertionError("a transient queue's message went through the journal")

    for name in ("submit", "send", "publish", "stage", "event", "pending", "pending_gone", "cursor"):
        setattr(manager.journal, name, refuse)


async def declare(manager: QueueManager, **policy: Any) -> None:
    await manager.declare("t", QueuePolicySettings(**policy), durable=False)


async def test_publish_hands_over_at_once_round_robin_and_ack_removes(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        a, b = Collector("a"), Collector("b")
        ha, hb = manager.consume("t", a), manager.consume("t", b)
        ha.add_credit(10)
        hb.add_credit(10)
        no_journal(manager)
        for i in range(6):
            assert manager.publish_nowait("t", msg(b"%d" % i)) is None
        # delivered within publish_nowait: no commit, no end of the loop's turn to wait for
        assert [d.offset for d in a.deliveries] == [0, 2, 4]
        assert [d.offset for d in b.deliveries] == [1, 3, 5]
        first = a.deliveries[0]
        assert (first.queue, first.group, first.attempt, first.redelivered) == ("t", "$default", 1, False)
        assert (ha.credit, hb.credit) == (7, 7)
        assert ha.settle_all_nowait([0, 2], ACK) == 2
        assert not ha.ack_nowait(1)  # b's, not a's
        assert hb.settle_all_nowait([1, 3, 5], ACK) == 3
        info = manager.info("t")
        assert (info.depth, info.pending) == (1, 1)  # offset 4, held by a
        state = manager.queues["t"]
        assert state.stats["published"] == 6 and state.stats["delivered"] == 6 and state.stats["acked"] == 5
        assert state.bytes == 1


async def test_without_credit_messages_wait_then_go_in_order(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        c = Collector("c")
        handle = manager.consume("t", c)
        no_journal(manager)
        for i in range(5):
            manager.publish_nowait("t", msg(b"%d" % i))
        assert c.deliveries == []
        handle.add_credit(3)
        assert c.payloads == [b"0", b"1", b"2"]
        handle.add_credit(5)
        assert c.payloads == [b"0", b"1", b"2", b"3", b"4"]


async def test_requeue_redelivers_flagged_and_cancel_gives_back(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        a = Collector("a")
        ha = manager.consume("t", a)
        ha.add_credit(1)
        manager.publish_nowait("t", msg(b"x"))
        assert ha.settle_nowait(0, RETRY_NOW)
        ha.add_credit(1)  # as a hull gives back the credit a settled delivery held
        assert [(d.offset, d.attempt, d.redelivered) for d in a.deliveries] == [(0, 1, False), (0, 2, True)]
        b = Collector("b")
        hb = manager.consume("t", b)
        await ha.cancel()  # what a held goes back, a failed attempt
        hb.add_credit(1)
        assert [(d.offset, d.attempt, d.redelivered) for d in b.deliveries] == [(0, 3, True)]


async def test_filters_expiry_and_auto_ack_keep_their_meaning(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager, ttl_s=0.05)
        filtered = Collector("f")
        manager.consume("t", filtered, routing_filter="a/+").add_credit(10)
        manager.publish_nowait("t", msg(b"skip"), routing_key="b/1")
        manager.publish_nowait("t", msg(b"take"), routing_key="a/1")
        assert filtered.payloads == [b"take"]
        await anyio.sleep(0.1)  # "skip" expired meanwhile: nobody gets it
        auto = Collector("auto")
        manager.consume("t", auto, auto_ack=True).add_credit(10)
        assert auto.payloads == []
        manager.publish_nowait("t", msg(b"now"), routing_key="b/2")
        assert auto.payloads == [b"now"]
        state = manager.queues["t"]
        assert [s.message.payload for s in state.messages.values()] == [b"take"]  # held by f


async def test_an_idle_auto_ack_consumer_takes_a_publish_straight_and_nothing_is_stored(
    make_manager: Factory,
) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        a, b = Collector("a"), Collector("b")
        ha = manager.consume("t", a, auto_ack=True)
        hb = manager.consume("t", b, auto_ack=True)
        no_journal(manager)
        manager.publish_nowait("t", msg(b"0"))  # no credit yet: it waits, stored
        state = manager.queues["t"]
        assert list(state.messages) == [0]
        ha.add_credit(3)
        hb.add_credit(3)
        for i in range(1, 5):
            manager.publish_nowait("t", msg(b"%d" % i))
        # round robin goes on from where the dispatch of offset 0 left it, handed over in order
        assert [d.offset for d in a.deliveries] == [0, 2, 4]
        assert [d.offset for d in b.deliveries] == [1, 3]
        assert (a.deliveries[1].attempt, a.deliveries[1].redelivered, a.deliveries[1].group) == (
            1,
            False,
            "$default",
        )
        assert (ha.credit, hb.credit) == (0, 1)
        assert state.messages == {} and state.bytes == 0
        assert (state.next_offset, state.high) == (5, 5)
        assert (state.stats["published"], state.stats["delivered"], state.stats["acked"]) == (5, 5, 5)
        info = manager.info("t")
        assert (info.depth, info.pending) == (0, 0)
        manager.publish_nowait("t", msg(b"5"))  # b's turn, b has credit
        manager.publish_nowait("t", msg(b"6"))  # nobody has credit: stored, waits
        assert b.payloads == [b"1", b"3", b"5"] and list(state.messages) == [6]
        manager.publish_nowait("t", msg(b"7", expires_at_ms=now_ms() + 60_000))
        ha.add_credit(2)
        assert a.payloads == [b"0", b"2", b"4", b"6", b"7"] and state.messages == {}


async def test_a_delivery_handed_over_at_once_is_held_and_times_out_as_any(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager, visibility_timeout_s=0.1)
        c = Collector("c")
        handle = manager.consume("t", c)
        handle.add_credit(5)
        manager.publish_nowait("t", msg(b"x"))  # an empty queue, a consumer with credit: at once
        assert c.payloads == [b"x"]
        state = manager.queues["t"]
        assert list(state.messages) == [0] and manager.info("t").pending == 1
        await wait_until(lambda: len(c.deliveries) == 2)  # not acked in time: back, attempt 2
        assert (c.deliveries[1].offset, c.deliveries[1].attempt, c.deliveries[1].redelivered) == (0, 2, True)
        assert handle.ack_nowait(0)
        assert manager.info("t").depth == 0 and state.stats["published"] == 1


async def test_a_message_expiring_on_its_own_is_never_delivered_late(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        c = Collector("c")
        handle = manager.consume("t", c)
        manager.publish_nowait("t", msg(b"old", expires_at_ms=now_ms() - 1))
        manager.publish_nowait("t", msg(b"new"))
        handle.add_credit(5)
        assert c.payloads == [b"new"]
        assert manager.queues["t"].stats["expired"] == 1


async def test_two_groups_each_get_everything_and_an_ack_keeps_it_for_the_other(
    make_manager: Factory,
) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        g1, g2 = Collector("g1"), Collector("g2")
        h1 = manager.consume("t", g1, group="one")
        h2 = manager.consume("t", g2, group="two")
        h1.add_credit(5)
        h2.add_credit(5)
        manager.publish_nowait("t", msg(b"m"))
        assert g1.payloads == [b"m"] and g2.payloads == [b"m"]
        assert h1.ack_nowait(0)
        assert manager.info("t").depth == 1  # group two holds it still
        assert h2.ack_nowait(0)
        assert manager.info("t").depth == 0


async def test_settled_deliveries_leave_no_time_outs_behind(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await declare(manager)
        c = Collector("c")
        handle = manager.consume("t", c)
        handle.add_credit(5000)
        for i in range(3000):
            manager.publish_nowait("t", msg(b"%d" % i))
        assert handle.ack_nowait(0) and handle.ack_nowait(1)
        timeouts = manager.queues["t"].groups["$default"].timeouts
        assert len(timeouts) == 2998  # the first two went with their acks
        for offset in range(3, 3000):  # 2 is held on: the time-outs behind it are compacted
            assert handle.ack_nowait(offset)
        assert len(timeouts) <= 1025
        info = manager.info("t")
        assert (info.depth, info.pending) == (1, 1)
