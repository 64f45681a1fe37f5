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
    assert node.delay_backend is None and node.delay_netns is None


def test_delay_puts_netem_above_tbf_and_sizes_its_queue():
    plan = plan_fabric(scenario(delay="5ms", jitter="1ms", loss="0.5%"), "abc123", SUBNET,
                       netem_available=True)
    assert plan.nodes[0].delay_backend == "netem" and plan.nodes[0].delay_netns is None
    egress = plan.nodes[0].egress
    assert [q.kind for q in egress] == ["netem", "tbf"]
    assert egress[1].parent == egress[0].handle + 1  # tbf hangs under netem's class 1
    assert egress[0].params["delay"] == 5000 and egress[0].params["jitter"] == 1000
    assert egress[0].params["loss"] == 0.5
    # Shaping toward the node stays a plain rate limit: delay is added once, where it is sent.
    assert [q.kind for q in plan.nodes[0].ingress] == ["tbf"]


def test_netem_limit_holds_the_bandwidth_delay_product():
    link = scenario(delay="50ms").link_for(0)
    packets_in_flight = 1e9 / 8 * 0.05 / 1514
    assert netem(link, 0x10000).params["limit"] >= 2 * packets_in_flight > 1000


def test_without_netem_the_delay_line_sits_between_node_and_switch():
    plan = plan_fabric(scenario(delay="1ms"), "abc123", SUBNET, netem_available=False)
    node = plan.nodes[1]
    assert node.delay_backend == "delay-line" and node.delay_netns == "nsdabc123-n1.dl"
    assert node.delay_netns in plan.namespaces
    assert [q.kind for q in node.egress] == ["tbf"]  # rate stays in the kernel


def test_delay_backend_choices():
    import pytest

    from netsim_ddp.fabric.errors import FabricError
    from netsim_ddp.fabric.plan import choose_delay_backend

    plain = scenario().link_for(0)
    delayed = scenario(delay="1ms").link_for(0)
    pareto = scenario(delay="1ms", jitter="100us", jitter_distribution="pareto").link_for(0)
    assert choose_delay_backend(plain, "auto", True) is None
    assert choose_delay_backend(delayed, "auto", True) == "netem"
    assert choose_delay_backend(delayed, "auto", False) == "delay-line"
    assert choose_delay_backend(delayed, "delay-line", True) == "delay-line"
    assert choose_delay_backend(pareto, "auto", True) == "delay-line"  # pyroute2: no tables
    with pytest.raises(FabricError, match="no netem qdisc"):
        choose_delay_backend(delayed, "netem", False)
    with pytest.raises(FabricError, match="distribution tables"):
        choose_delay_backend(pareto, "netem", True)
