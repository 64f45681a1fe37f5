import ipaddress

from netsim_ddp import Scenario
from netsim_ddp.fabric.plan import TIMER_HZ, netem, plan_fabric, tbf_burst

SUBNET = ipaddress.IPv4Network("10.200.3.0/24")


def scenario(**link):
    return Scenario.from_dict({"name": "p", "topology": {"nodes": 3},
                               "link": {"rate": "1gbit", **link}})


def test_burst_covers_a_timer_tick_at_high_rates():
    # At 10gbit a tick is 5 MB: a burst sized for 1 Mbit/s would cap the link far below.
    assert tbf_burst(10e9, 1500) >= 10e9 / 8 / TIMER_HZ
    assert tbf_burst(1e9, 1500) == 1e9 / 8 / TIMER_HZ + 1514
    assert tbf_burst(1e6, 1500) == 2 * 1514  # never below two frames


def test_plan_names_addresses_and_qdiscs():
    plan = plan_fabric(scenario(), "abc123", SUBNET)
    assert plan.switch_netns == "nsdabc123-sw"
    assert [n.netns for n in plan.nodes] == ["nsdabc123-n0", "nsdabc123-n1", "nsdabc123-n2"]
    assert [n.address for n in plan.nodes] == ["10.200.3.1", "10.200.3.2", "10.200.3.3"]
    assert all(name.startswith("nsd") for name in plan.namespaces)
    node = plan.nodes[0]
    assert node.switch_port == "nsd-n0"
    assert [q.kind for q in node.egress] == ["tbf"] and [q.kind for q in node.ingress] == ["tbf"]
    assert node.egress[0].params["rate"] == "1000000000bit"
    assert node.egress[0].params["limit"] == 1000 * 1514
    assert not plan.needs_netem


def test_delay_puts_netem_above_tbf_and_sizes_its_queue():
    plan = plan_fabric(scenario(delay="5ms", jitter="1ms", loss="0.5%"), "abc123", SUBNET)
    egress = plan.nodes[0].egress
    assert [q.kind for q in egress] == ["netem", "tbf"]
    assert egress[1].parent == egress[0].handle + 1  # tbf hangs under netem's class 1
    assert egress[0].params["delay"] == 5000 and egress[0].params["jitter"] == 1000
    assert egress[0].params["loss"] == 0.5
    assert plan.needs_netem
    # Shaping toward the node stays a plain rate limit: delay is added once, where it is sent.
    assert [q.kind for q in plan.nodes[0].ingress] == ["tbf"]


def test_netem_limit_holds_the_bandwidth_delay_product():
    link = scenario(delay="50ms").link_for(0)
    packets_in_flight = 1e9 / 8 * 0.05 / 1514
    assert netem(link, 0x10000).params["limit"] >= 2 * packets_in_flight > 1000
