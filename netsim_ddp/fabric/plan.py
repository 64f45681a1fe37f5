"""The fabric as pure data: what namespaces, links, addresses and qdiscs a scenario needs.

Computed before anything touches the kernel, so it can be unit-tested without root and shown to
people (`netsim-ddp plan`). `fabric.emulated_network.Fabric` realises it when entered.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.scenario.spec import EffectiveLink, Scenario, queue_limit_bytes
from netsim_ddp.scenario.units import ETHERNET_HEADER

# tbf refills tokens from a timer; the burst must cover a tick's worth of bytes at the rate or
# the rate is never reached (the classic bug). CONFIG_HZ is 250 on this project's machines; a
# lower HZ kernel only needs less, since tbf's watchdog uses high-resolution timers.
TIMER_HZ = 250
NETEM_DEFAULT_LIMIT = 1000  # packets


@dataclass(frozen=True)
class QdiscPlan:
    """One qdisc: kind, where it hangs, and pyroute2 `tc()` keyword arguments."""

    kind: str
    handle: int
    parent: int | None  # None: the root qdisc
    params: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class NodePlan:
    index: int
    name: str
    netns: str
    address: str
    prefixlen: int
    switch_port: str
    link: EffectiveLink
    egress: tuple[QdiscPlan, ...]  # on the node's eth0: what the node sends
    ingress: tuple[QdiscPlan, ...]  # on the switch port: what the node receives
    delay_backend: str | None = None  # "netem", "delay-line", or None: no delay/jitter/loss
    delay_netns: str | None = None  # the delay line's namespace, between node and switch
    rack: int = 0  # the rack bridge its switch port joins (racks > 1)


@dataclass(frozen=True)
class RackPlan:
    """A rack switch (a bridge in the switch's namespace) and its uplink to the spine (the
    fabric's own bridge): a veth pair, each end shaped on its egress, rack -> spine on `up`,
    spine -> rack on `down`."""

    index: int
    bridge: str
    up: str  # the uplink's end in the rack bridge
    down: str  # its end in the spine bridge
    rate_bps: float
    queue_bytes: int
    qdiscs: tuple[QdiscPlan, ...]  # on each end


@dataclass(frozen=True)
class FabricPlan:
    run_id: str
    scenario: str
    switch_netns: str
    bridge: str
    subnet: ipaddress.IPv4Network
    mtu: int
    nodes: tuple[NodePlan, ...]
    racks: tuple[RackPlan, ...] = ()  # none: every node on the one switch

    @property
    def namespaces(self) -> list[str]:
        delay = [node.delay_netns for node in self.nodes if node.delay_netns]
        return [self.switch_netns] + [node.netns for node in self.nodes] + delay


def tbf_burst(rate_bps: float, mtu: int) -> int:
    """Bucket size for tbf: one timer tick of data at the rate, plus a frame."""
    frame = mtu + ETHERNET_HEADER
    return max(math.ceil(rate_bps / 8 / TIMER_HZ) + frame, 2 * frame)


def tbf(link: EffectiveLink, handle: int, parent: int | None) -> QdiscPlan:
    return tbf_at(link.rate, link.mtu, link.queue_limit_bytes, handle, parent)


def tbf_at(rate_bps: float, mtu: int, limit_bytes: int, handle: int = 0x10000,
           parent: int | None = None) -> QdiscPlan:
    return QdiscPlan("tbf", handle, parent, {
        "rate": f"{int(rate_bps)}bit",
        "burst": tbf_burst(rate_bps, mtu),
        "limit": limit_bytes,
    })


def plan_racks(scenario: Scenario) -> tuple[RackPlan, ...]:
    """The racks' switches and uplinks (none for one rack)."""
    topology = scenario.topology
    if topology.racks == 1:
        return ()
    assert topology.uplink is not None  # validated with racks > 1
    mtu = scenario.link.mtu
    queue = queue_limit_bytes(topology.uplink.queue_limit, mtu + ETHERNET_HEADER)
    rate = topology.uplink.rate
    return tuple(RackPlan(index=r, bridge=naming.rack_bridge(r), up=naming.uplink(r, "u"),
                          down=naming.uplink(r, "d"), rate_bps=rate, queue_bytes=queue,
                          qdiscs=(tbf_at(rate, mtu, queue),))
                 for r in range(topology.racks))


def netem(link: EffectiveLink, handle: int) -> QdiscPlan:
    """Delay, jitter and loss. Its queue must hold rate x delay (x2 with jitter), or netem's
    default 1000 packets throttles the link once delay is added."""
    frame = link.mtu + ETHERNET_HEADER
    in_flight = link.rate / 8 * (link.delay + 2 * link.jitter) / frame
    limit = max(NETEM_DEFAULT_LIMIT, math.ceil(2 * in_flight) + link.queue_limit_bytes // frame)
    return QdiscPlan("netem", handle, None, {
        "delay": round(link.delay * 1e6),  # microseconds
        "jitter": round(link.jitter * 1e6),
        "loss": link.loss,
        "limit": limit,
    })


def egress_qdiscs(link: EffectiveLink, delay_backend: str | None) -> tuple[QdiscPlan, ...]:
    """A node's own egress: netem (if it applies delay, jitter or loss) with tbf beneath it.

    Delay, jitter and loss are applied once, to what the node sends, so a round trip between
    two nodes carries both their delays: 2 x the one-way delay when links are alike. The
    delay line does the same between the node's NIC and the switch.
    """
    if delay_backend != "netem":
        return (tbf(link, 0x10000, None),)
    return (netem(link, 0x10000), tbf(link, 0x100000, 0x10001))


def choose_delay_backend(link: EffectiveLink, setting: str, netem_available: bool) -> str | None:
    """netem where the kernel has it (and the jitter is uniform), else the delay line."""
    if not link.impaired:
        return None
    if setting == "netem":
        if not netem_available:
            raise FabricError(
                "link.delay_backend = 'netem' but this kernel has no netem qdisc (sch_netem, "
                "CONFIG_NET_SCH_NETEM); use 'auto' or 'delay-line' for the userspace delay line")
        if link.jitter_distribution != "uniform":
            raise FabricError(
                f"link.jitter_distribution = {link.jitter_distribution!r} needs netem's "
                "distribution tables, which pyroute2 cannot load; use delay_backend = "
                "'delay-line' or 'auto'")
        return "netem"
    if setting == "auto" and netem_available and link.jitter_distribution == "uniform":
        return "netem"
    return "delay-line"


def ingress_qdiscs(link: EffectiveLink) -> tuple[QdiscPlan, ...]:
    """The switch port's egress toward the node: the rate cap of what the node receives."""
    return (tbf(link, 0x10000, None),)


def plan_fabric(scenario: Scenario, run_id: str, subnet: ipaddress.IPv4Network,
                netem_available: bool = False) -> FabricPlan:
    names = scenario.topology.node_names
    racks_of = scenario.topology.node_racks
    hosts = subnet.hosts()
    nodes = []
    for index, name in enumerate(names):
        link = scenario.link_for(index)
        backend = choose_delay_backend(link, scenario.link.delay_backend, netem_available)
        nodes.append(NodePlan(
            index=index,
            name=name,
            netns=naming.netns_name(run_id, name),
            address=str(next(hosts)),
            prefixlen=subnet.prefixlen,
            switch_port=naming.switch_port(name),
            link=link,
            egress=egress_qdiscs(link, backend),
            ingress=ingress_qdiscs(link),
            delay_backend=backend,
            delay_netns=(naming.netns_name(run_id, f"{name}.dl") if backend == "delay-line"
                         else None),
            rack=racks_of[index],
        ))
    return FabricPlan(
        run_id=run_id,
        scenario=scenario.name,
        switch_netns=naming.netns_name(run_id, naming.SWITCH_ROLE),
        bridge=naming.BRIDGE,
        subnet=subnet,
        mtu=scenario.link.mtu,
        nodes=tuple(nodes),
        racks=plan_racks(scenario),
    )
