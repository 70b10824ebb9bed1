"""The route table: which nodes a publish goes to (sans-IO)."""

from __future__ import annotations

from trimaran.cluster.routes import RouteTable


def test_a_publish_goes_only_to_nodes_with_a_matching_route() -> None:
    table = RouteTable("a")
    table.add("b", "sensors/+/temp")
    table.add("c", "other/#")
    table.add("a", "sensors/#")
    assert set(table.targets("sensors/1/temp").nodes) == {"b"}
    assert set(table.targets("other/x").nodes) == {"c"}
    assert table.targets("nothing").nodes == {}
    assert table.targets("sensors/1/hum").nodes == {}  # only this node's own route matches


def test_overlapping_routes_of_a_node_forward_once() -> None:
    table = RouteTable("a")
    for key in ("x/#", "x/+", "x/y", "#"):
        table.add("b", key)
    assert table.targets("x/y").nodes == {"b": []}


def test_the_dollar_rule_holds_for_routes() -> None:
    table = RouteTable("a")
    table.add("b", "#")
    assert table.targets("$SYS/broker/uptime").nodes == {}
    table.add("b", "$SYS/#")
    assert set(table.targets("$SYS/broker/uptime").nodes) == {"b"}


def test_routes_are_compacted_per_node_and_removed_once() -> None:
    table = RouteTable("a")
    assert table.add("b", "t/#")
    assert not table.add("b", "t/#")
    assert table.count("b") == 1
    assert table.remove("b", "t/#")
    assert not table.remove("b", "t/#")
    assert table.targets("t/1").nodes == {}


def test_a_dead_node_loses_every_route() -> None:
    table = RouteTable("a")
    table.replace("b", ["t/1", "t/2", "$share/g/t/+"])
    assert table.count("b") == 3
    assert table.drop_node("b") == 3
    assert table.targets("t/1").nodes == {}
    assert table.nodes() == []


def test_replace_makes_a_nodes_routes_exactly_the_given_ones() -> None:
    table = RouteTable("a")
    table.replace("b", ["t/1", "t/2"])
    table.replace("b", ["t/2", "t/3"])
    assert table.targets("t/1").nodes == {}
    assert set(table.targets("t/3").nodes) == {"b"}


def test_invalid_filters_from_a_notice_are_ignored() -> None:
    table = RouteTable("a")
    assert not table.add("b", "a/#/b")
    assert not table.add("b", "$share/g")
    assert table.count("b") == 0


def test_a_share_group_over_several_nodes_takes_turns_with_one_member_each_time() -> None:
    table = RouteTable("a")
    table.add("a", "$share/g/jobs/+")
    table.add("b", "$share/g/jobs/+")
    table.add("c", "$share/g/jobs/+")
    seen = []
    for _ in range(6):
        targets = table.targets("jobs/1")
        served = [node for node, shares in targets.nodes.items() if ("g", "jobs/+") in shares]
        if served:
            assert targets.elsewhere == frozenset({("g", "jobs/+")})
            seen.append(served[0])
        else:
            assert targets.elsewhere == frozenset()  # this node's own member serves it
            seen.append("a")
    assert sorted(seen) == ["a", "a", "b", "b", "c", "c"]


def test_a_node_with_a_plain_route_and_a_share_group_gets_one_forward() -> None:
    table = RouteTable("a")
    table.add("b", "jobs/#")
    table.add("b", "$share/g/jobs/#")
    targets = table.targets("jobs/1")
    assert targets.nodes == {"b": [("g", "jobs/#")]}
    assert targets.elsewhere == frozenset({("g", "jobs/#")})


def test_a_tenants_routes_carry_its_vhost_across_nodes() -> None:
    """Keys carry the vhost (trimaran/vhosts.py): a node's tenant subscriptions are routes for that
    tenant's publishes only, and the $ rule holds at the tenant's own first level."""
    from trimaran.vhosts import prefix

    t1, t2 = prefix("t1"), prefix("t2")
    table = RouteTable("a")
    table.add("b", t1 + "#")
    table.add("c", "#")
    table.add("d", f"$share/g/{t2}jobs/+")
    assert set(table.targets(t1 + "x/y").nodes) == {"b"}
    assert table.targets(t1 + "$SYS/x").nodes == {}
    assert set(table.targets("x/y").nodes) == {"c"}
    assert set(table.targets(t2 + "jobs/1").nodes) == {"d"}
    assert table.targets(t1 + "jobs/1").nodes.keys() == {"b"}
