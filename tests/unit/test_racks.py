"""`[topology] racks`: validation that names the field, each node's rack, and the ring's
capacity behind oversubscribed uplinks (no network: tests/netns/test_racks_netns.py builds it)."""

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.fabric.plan import plan_racks
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.racks import ring_caps
from netsim_ddp.scenario.spec import ScenarioError


def racked(nodes=4, racks=2, uplink="10gbit", **topology) -> Scenario:
    return Scenario.from_dict({"name": "r", "topology": {
        "nodes": nodes, "racks": racks, "uplink": {"rate": uplink}, **topology},
        "link": {"rate": "10gbit"}})


def test_nodes_fill_racks_in_order_unless_told():
    assert racked(nodes=6, racks=3).topology.node_racks == [0, 0, 1, 1, 2, 2]
    assert racked(rack_of=[0, 1, 0, 1]).topology.node_racks == [0, 1, 0, 1]


@pytest.mark.parametrize(("topology", "match"), [
    ({"nodes": 2, "racks": 3, "uplink": {"rate": "1gbit"}}, "every rack needs a node"),
    ({"nodes": 4, "racks": 2}, r"needs \[topology.uplink\]"),
    ({"nodes": 4, "uplink": {"rate": "1gbit"}}, "need racks >= 2"),
    ({"nodes": 4, "racks": 2, "uplink": {"rate": "1gbit"}, "rack_of": [0, 0, 0, 0]},
     "at least one node in each"),
    ({"nodes": 4, "racks": 2, "uplink": {"rate": "1gbit"}, "rack_of": [0, 1]}, "lists 2"),
])
def test_what_cannot_be_built_names_the_field(topology, match):
    with pytest.raises(ScenarioError, match=match) as caught:
        Scenario.from_dict({"name": "r", "topology": topology, "link": {"rate": "1gbit"}})
    assert "topology" in str(caught.value)


def test_a_contiguous_ring_crosses_each_uplink_once_each_way():
    # 8 x 10GbE nodes in 2 racks on a 20 Gbit/s uplink (2:1): the ring's two crossing hops
    # have the uplink each way to themselves, so the ring runs at the node links' 10 Gbit/s.
    assert ring_caps(racked(nodes=8, uplink="20gbit")) == [10e9] * 8
    assert ring_caps(racked(nodes=8, uplink="5gbit")) == [10e9, 10e9, 10e9, 5e9] * 2


def test_a_scattered_ring_shares_the_uplinks():
    # Alternate racks: all four hops cross, two per uplink direction: half the uplink each.
    scattered = racked(uplink="10gbit", rack_of=[0, 1, 0, 1])
    assert ring_caps(scattered) == [5e9] * 4
    assert slowest_link_goodput(scattered)[0] == 5e9


def test_uplinks_are_dilated_and_shaped_both_ways():
    host = dilated(racked(uplink="20gbit"), 40)
    assert host.topology.uplink.rate == pytest.approx(20e9 / 40)
    racks = plan_racks(host)
    assert [rack.bridge for rack in racks] == ["nsd.r0", "nsd.r1"]
    assert {rack.up for rack in racks} | {rack.down for rack in racks} == {
        "nsd.u0", "nsd.u1", "nsd.d0", "nsd.d1"}
    (tbf,) = racks[0].qdiscs
    assert tbf.kind == "tbf" and tbf.params["rate"] == f"{int(20e9 / 40)}bit"
    assert tbf.params["limit"] == 512 * 1024  # the ToR share default, bytes kept under dilation
    assert plan_racks(Scenario.from_dict({"name": "one", "topology": {"nodes": 2},
                                          "link": {"rate": "1gbit"}})) == ()
