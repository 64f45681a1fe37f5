"""`Fabric`: a scenario's network, built from its plan and always taken down again.

Each kernel object is owned by an ExitStack: its teardown is registered right after its
creation succeeds, so leaving the `with` block, an exception, SIGINT or SIGTERM remove exactly
what exists. Every process the fabric starts lives in the run's PID namespace
(lifetime.ProcessNamespace), which the kernel ends with the harness, SIGKILL included, and which
teardown ends before any network namespace loses its name. SIGKILL leaves the named network
namespaces (empty): `netsim-ddp clean` sweeps them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import random
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import TC_H_ROOT

from netsim_ddp.fabric import delayline, naming, tcp_clocks
from netsim_ddp.fabric.capabilities import probe_capabilities
from netsim_ddp.fabric.counters.qdisc_stats import (
    basic_counts,
    loss_counts,
    queue_length,
    root_qdisc,
)
from netsim_ddp.fabric.delayline.health import ForwarderMonitor
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.namespaces import netns, privilege
from netsim_ddp.fabric.namespaces.lifetime import ProcessNamespace
from netsim_ddp.fabric.plan import FabricPlan, NodePlan, QdiscPlan, plan_fabric
from netsim_ddp.fabric.teardown_signals import signals_deferred, signals_raise
from netsim_ddp.scenario.spec import Scenario

# Where per-run subnets are drawn from when the scenario names none.
SUBNET_POOL = ipaddress.IPv4Network("10.128.0.0/9")
_TERMINATE_GRACE_S = 3.0
LOOPBACK_INDEX = 1
ETH0_INDEX = 2  # in each node's namespace
BRIDGE_INDEX = 2  # in the switch's namespace
FIRST_PORT_INDEX = 10  # switch port of node i: FIRST_PORT_INDEX + i
RACK_BRIDGE_INDEX = 2000  # rack r's bridge: + r (after every possible port)
UPLINK_INDEX = 3000  # rack r's uplink end in its bridge: + r; the spine's end is looked up
DELAY_IN, DELAY_IN_INDEX = "in", 2  # in a delay line's namespace: from the node
DELAY_OUT = "out"  # ...and toward the switch (index 3)


@dataclass(frozen=True)
class LinkCounters:
    """Bytes and packets on a node's link (wire packets, headers included, as tc counts)."""

    sent_bytes: int  # by the node, onto the wire
    received_bytes: int  # by the node, off the wire
    sent_packets: int
    received_packets: int


class Node:
    """One emulated host: a namespace with `eth0` on the switch."""

    def __init__(self, fabric: Fabric, plan: NodePlan):
        self._fabric = fabric
        self.plan = plan
        self.index = plan.index
        self.name = plan.name
        self.address = plan.address
        self.netns = plan.netns

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.address}, netns={self.netns!r})"

    def entered(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread inside this node's namespace for the block."""
        return netns.entered(self.netns)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start a process inside this node (its network is the node's eth0 and lo), in the
        run's PID namespace: it cannot outlive the run (see lifetime.py)."""
        return self._fabric._popen(argv, self.netns, **kwargs)

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket that lives in this node's namespace, usable from any thread."""
        with self.entered():
            return socket.socket(family, kind)


class Fabric:
    """Context manager that builds `scenario`'s network and removes it on exit."""

    def __init__(self, scenario: Scenario, *, run_id: str | None = None, dilation: float = 1.0,
                 only_nodes: Sequence[int] | None = None,
                 subnet: ipaddress.IPv4Network | None = None):
        self.scenario = scenario
        self.dilation = dilation  # k of a scale model: the nodes' TCP clocks run k times slower
        # One machine's share of a scale model spread over several (run/hosts/machine_agent.py):
        # only these nodes are built, with the addresses they have in the whole job's `subnet`.
        self.only_nodes = None if only_nodes is None else frozenset(only_nodes)
        self.subnet = subnet
        self.tcp_settings: dict[str, dict[str, str | int]] = {}  # per node, read back
        self.run_id = run_id or naming.new_run_id()
        self.plan: FabricPlan | None = None
        self.nodes: list[Node] = []
        self._stack: contextlib.ExitStack | None = None
        self._iproutes: dict[str, IPRoute] = {}
        self._processes: list[subprocess.Popen] = []
        self._pid_namespace: ProcessNamespace | None = None
        self.delay_line_stats: dict[str, dict[str, object]] = {}  # filled when it closes
        self.delay_lines: dict[str, ForwarderMonitor] = {}  # kept after close: their counters

    # -- lifetime ---------------------------------------------------------------------------

    def __enter__(self) -> Fabric:
        mode = privilege.ensure_network_privilege()
        plan = self._plan()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(signals_raise())
            lock = naming.RunLock(self.run_id)
            lock.acquire()
            stack.callback(lock.release)
            for name in plan.namespaces:
                netns.create(name)
                stack.callback(netns.remove, name)
            # Ended before the names go, so no process is left in an unnamed namespace.
            self._pid_namespace = stack.enter_context(ProcessNamespace(self.run_id))
            stack.callback(self._stop_processes, plan.namespaces)
            for name in plan.namespaces:
                with netns.entered(name):
                    _disable_ipv6()  # no router solicitations or MLD in the byte counts
                    self._iproutes[name] = stack.enter_context(IPRoute())
            self._build_switch(plan)
            for node in plan.nodes:
                self._build_node(plan, node)
                self._set_tcp(node)
            self._build_uplinks(plan)
            for node in plan.nodes:
                if node.delay_backend == "delay-line":
                    self._start_delay_line(stack, node, rt_priority=10 if mode == "root" else 0)
        except BaseException:
            with signals_deferred():
                stack.close()
            raise
        self.plan = plan
        self.nodes = [Node(self, node) for node in plan.nodes]
        self._stack = stack
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        stack, self._stack = self._stack, None
        self._iproutes.clear()
        if stack is not None:
            with signals_deferred():
                stack.close()

    # -- building ---------------------------------------------------------------------------

    def _plan(self) -> FabricPlan:
        """The plan, with delay backends chosen by what this host has; checked before any
        kernel object exists."""
        impaired = any(self.scenario.link_for(i).impaired
                       for i in range(self.scenario.topology.nodes))
        netem = impaired and self.scenario.link.delay_backend != "delay-line" \
            and probe_capabilities().netem
        plan = plan_fabric(self.scenario, self.run_id,
                           self.subnet or choose_subnet(self.scenario, self.run_id), netem)
        if self.only_nodes is not None:
            plan = dataclasses.replace(plan, nodes=tuple(
                node for node in plan.nodes if node.index in self.only_nodes))
        if any(node.delay_backend == "delay-line" for node in plan.nodes):
            try:
                delayline.build_binary()
            except delayline.DelayLineBuildError as exc:
                raise FabricError(f"scenario {self.scenario.name!r} needs the delay line "
                                  f"(no netem here), which cannot be built: {exc}") from None
        return plan

    # Interface indexes are known, not looked up (a lookup dumps every link, which doubled the
    # build time): the namespaces are fresh, only lo (index 1) exists, so the first interface
    # made in one gets index 2, the next 3. The kernel honours a requested index; pyroute2
    # does not pass one for a veth's peer, so peers get theirs by that creation order.
    def _build_switch(self, plan: FabricPlan) -> None:
        ipr = self._iproutes[plan.switch_netns]
        ipr.link("add", index=BRIDGE_INDEX, ifname=plan.bridge, kind="bridge", mtu=plan.mtu)
        ipr.link("set", index=BRIDGE_INDEX, state="up")
        for rack in plan.racks:  # the fabric's bridge is then the spine
            ipr.link("add", index=RACK_BRIDGE_INDEX + rack.index, ifname=rack.bridge,
                     kind="bridge", mtu=plan.mtu)

    def _build_uplinks(self, plan: FabricPlan) -> None:
        """Each rack's uplink, after the node ports: its spine end takes the kernel's next free
        index, which made before them ran into the ports' (3, 4, ... reached port 10 at 8
        racks: 'File exists')."""
        ipr = self._iproutes[plan.switch_netns]
        for rack in plan.racks:
            bridge, up = RACK_BRIDGE_INDEX + rack.index, UPLINK_INDEX + rack.index
            ipr.link("add", index=up, ifname=rack.up, kind="veth", mtu=plan.mtu,
                     peer={"ifname": rack.down, "mtu": plan.mtu})
            down = ipr.link("get", ifname=rack.down)[0]["index"]
            for index, master in ((up, bridge), (down, BRIDGE_INDEX)):
                _apply_qdiscs(ipr, index, rack.qdiscs)
                ipr.link("set", index=index, master=master, state="up")
            ipr.link("set", index=bridge, state="up")

    def _build_node(self, plan: FabricPlan, node: NodePlan) -> None:
        switch = self._iproutes[plan.switch_netns]
        port = FIRST_PORT_INDEX + node.index
        mtu = node.link.mtu
        if node.delay_netns is None:  # node eth0 <-> switch port
            _veth(switch, port, node.switch_port, node.netns, naming.NODE_IFNAME, mtu)
        else:  # node eth0 <-> "in" [delay line] "out" <-> switch port
            delay = self._iproutes[node.delay_netns]
            _veth(delay, DELAY_IN_INDEX, DELAY_IN, node.netns, naming.NODE_IFNAME, mtu)
            _veth(switch, port, node.switch_port, node.delay_netns, DELAY_OUT, mtu)
            delayline.prepare_delay_namespace(delay, DELAY_IN, DELAY_OUT)
        _apply_qdiscs(switch, port, node.ingress)
        master = RACK_BRIDGE_INDEX + node.rack if plan.racks else BRIDGE_INDEX
        switch.link("set", index=port, master=master, state="up")

        ipr = self._iproutes[node.netns]
        ipr.addr("add", index=ETH0_INDEX, address=node.address, prefixlen=node.prefixlen)
        _apply_qdiscs(ipr, ETH0_INDEX, node.egress)
        ipr.link("set", index=ETH0_INDEX, state="up")
        ipr.link("set", index=LOOPBACK_INDEX, state="up")

    def _set_tcp(self, node: NodePlan) -> None:
        """[link.tcp] and the kernel's TCP clocks, dilated by k, in the node's namespace
        before anything there opens a socket; what the kernel then holds is recorded."""
        tcp = self.scenario.link.tcp
        ipr = self._iproutes[node.netns]
        with netns.entered(node.netns):
            on_route = tcp_clocks.write_sysctls(tcp_clocks.namespace_sysctls(tcp, self.dilation))
            tcp_clocks.set_route_metrics(ipr, ETH0_INDEX, tcp_clocks.route_metrics(
                tcp, self.dilation, on_route))
            self.tcp_settings[node.name] = tcp_clocks.read_settings(ipr, ETH0_INDEX)

    def _start_delay_line(self, stack: contextlib.ExitStack, node: NodePlan,
                          rt_priority: int) -> None:
        assert node.delay_netns is not None  # planned for every node whose backend is the line
        link = node.link
        spec = delayline.DelayLineSpec(
            delay_s=link.delay, jitter_s=link.jitter, distribution=link.jitter_distribution,
            loss_pct=link.loss, seed=node.index + 1,
            queue_bytes=delayline.queue_bytes_for(link.rate, link.delay, link.jitter))
        argv = delayline.command(spec, DELAY_IN, DELAY_OUT, rt_priority=rt_priority)
        process = self._popen(argv, node.delay_netns, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        stack.callback(self._stop_delay_line, node.name)
        delayline.wait_ready(process)
        self.delay_lines[node.name] = ForwarderMonitor(node.name, process)

    def _stop_delay_line(self, node: str) -> None:
        """SIGTERM the forwarder and keep its counters (late releases, drops) for reports, or
        why there are none (it died: exit status and stderr)."""
        monitor = self.delay_lines.get(node)
        if monitor is None:
            return  # it never became ready: that error is already on its way
        try:
            self.delay_line_stats[node] = dict(monitor.stop(_TERMINATE_GRACE_S))
        except delayline.DelayLineError as exc:
            self.delay_line_stats[node] = {"error": str(exc)}

    def check_delay_lines(self) -> None:
        """Raise DelayLineError, with its exit status and stderr, if a forwarder died."""
        for monitor in self.delay_lines.values():
            monitor.check_alive()

    @property
    def delay_backends(self) -> dict[str, str | None]:
        """Per node, what applies its delay, jitter and loss (None: nothing to apply)."""
        return {node.name: node.delay_backend for node in self._require_plan().nodes}

    # -- running ----------------------------------------------------------------------------

    def node(self, name_or_index: str | int) -> Node:
        if isinstance(name_or_index, int):
            return self.nodes[name_or_index]
        for node in self.nodes:
            if node.name == name_or_index:
                return node
        raise KeyError(f"no node named {name_or_index!r}")

    def counters(self) -> dict[str, LinkCounters]:
        """Per node, what crossed its link so far, from the root qdiscs that shape it.

        Qdisc counters are the wire's: a TSO/GSO super-packet counts as the segments it
        becomes, each with its headers (interface counters would count one set of headers).
        """
        plan = self._require_plan()
        switch = self._iproutes[plan.switch_netns]
        received = {msg["index"]: _qdisc_summary(msg)
                    for msg in switch.get_qdiscs() if msg["parent"] == TC_H_ROOT}
        result = {}
        for node in plan.nodes:
            sent = self._root_qdisc(node.netns, ETH0_INDEX)
            into = received[FIRST_PORT_INDEX + node.index]
            result[node.name] = LinkCounters(
                sent_bytes=sent["bytes"], received_bytes=into["bytes"],
                sent_packets=sent["packets"], received_packets=into["packets"],
            )
        return result

    def uplink_counters(self) -> dict[str, dict[str, int | None]]:
        """Per rack and direction ("r0 up": rack -> spine, "r0 down"), what its uplink's tbf
        passed and dropped so far: where traffic between racks queues and is lost."""
        plan = self._require_plan()
        switch = self._iproutes[plan.switch_netns]
        result = {}
        for rack in plan.racks:
            for direction, ifname in (("up", rack.up), ("down", rack.down)):
                index = switch.link("get", ifname=ifname)[0]["index"]
                msg = root_qdisc(switch, index)
                counts = basic_counts(msg) if msg is not None else None
                losses = loss_counts(msg) if msg is not None else None
                result[f"r{rack.index} {direction}"] = {
                    "bytes": counts[0] if counts else None,
                    "packets": counts[1] if counts else None,
                    "drops": losses[0] if losses else None,
                    "overlimits": losses[1] if losses else None}
        return result

    def wait_drained(self, timeout_s: float = 5.0) -> bool:
        """Wait until no packet is queued on any link, so counters read afterwards are final.
        Returns False if traffic is still queued after `timeout_s`."""
        plan = self._require_plan()
        deadline = time.monotonic() + timeout_s
        while True:
            switch = self._iproutes[plan.switch_netns]
            backlog = sum(queue_length(msg) for msg in switch.get_qdiscs())
            backlog += sum(queue_length(msg) for node in plan.nodes
                           for msg in self._iproutes[node.netns].get_qdiscs(index=ETH0_INDEX))
            if backlog == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def _root_qdisc(self, namespace: str, index: int) -> dict[str, Any]:
        msg = root_qdisc(self._iproutes[namespace], index)
        if msg is not None:
            return _qdisc_summary(msg)
        raise FabricError(f"no root qdisc on interface {index} in {namespace}")

    def qdiscs(self, node: str | int) -> list[dict[str, Any]]:
        """The qdiscs on a node's eth0 as the kernel reports them (kind, handle, bytes sent)."""
        target = self.node(node)
        ipr = self._iproutes[target.netns]
        return [_qdisc_summary(msg) for msg in ipr.get_qdiscs(index=ETH0_INDEX)]

    def _require_plan(self) -> FabricPlan:
        if self.plan is None:
            raise FabricError("the fabric is not built; use it inside `with Fabric(scenario):`")
        return self.plan

    def _popen(self, argv: Sequence[str], namespace: str, **kwargs) -> subprocess.Popen:
        if self._pid_namespace is None:
            raise FabricError("the fabric is not built; use it inside `with Fabric(scenario):`")
        process = self._pid_namespace.popen(argv, namespace, **kwargs)
        self._processes.append(process)
        return process

    def _stop_processes(self, namespaces: list[str]) -> None:
        """Terminate what was started in the nodes, then kill whatever still lives there."""
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_TERMINATE_GRACE_S)
        netns.kill_processes_in(namespaces)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_TERMINATE_GRACE_S)


def choose_subnet(scenario: Scenario, run_id: str) -> ipaddress.IPv4Network:
    """The scenario's subnet, or a /24 drawn per run that the host itself doesn't use.

    The nodes can't reach the host's networks either way; avoiding overlap keeps their
    addresses unambiguous to people reading output and packet captures.
    """
    if scenario.topology.subnet is not None:
        return scenario.topology.subnet
    in_use = _host_networks()
    draw = random.Random(run_id)
    count = 2 ** (24 - SUBNET_POOL.prefixlen)
    for _ in range(64):
        start = SUBNET_POOL.network_address + draw.randrange(count) * 256
        subnet = ipaddress.IPv4Network(f"{start}/24")
        if not any(subnet.overlaps(net) for net in in_use):
            return subnet
    raise FabricError(f"no free /24 in {SUBNET_POOL}; set topology.subnet in the scenario")


def _veth(ipr: IPRoute, index: int, ifname: str, peer_netns: str, peer_ifname: str,
          mtu: int) -> None:
    """A veth pair made in `ipr`'s namespace, its peer placed straight into `peer_netns`
    (where it takes the next free index)."""
    fd = os.open(netns.path_of(peer_netns), os.O_RDONLY)
    try:
        ipr.link("add", index=index, ifname=ifname, kind="veth", mtu=mtu,
                 peer={"ifname": peer_ifname, "net_ns_fd": fd, "mtu": mtu})
    finally:
        os.close(fd)


def _apply_qdiscs(ipr: IPRoute, index: int, qdiscs: tuple[QdiscPlan, ...]) -> None:
    for qdisc in qdiscs:
        placement = {"parent": qdisc.parent} if qdisc.parent is not None else {}
        ipr.tc("add", qdisc.kind, index=index, handle=qdisc.handle, **placement, **qdisc.params)


def _qdisc_summary(msg) -> dict[str, Any]:
    counts = basic_counts(msg)
    return {
        "kind": msg.get_attr("TCA_KIND"),
        "handle": msg["handle"],
        "parent": msg["parent"],
        "bytes": counts[0] if counts else None,
        "packets": counts[1] if counts else None,
    }


def _disable_ipv6() -> None:
    """For interfaces created from now on in the current namespace (`default`, not `all`:
    each write costs ~1.5 ms and only the veths made afterwards matter)."""
    with contextlib.suppress(FileNotFoundError):
        with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as knob:
            knob.write("1")


def _host_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks the host's own namespace has addresses or routes in (read only)."""
    networks = []
    with IPRoute() as ipr:
        for addr in ipr.get_addr(family=socket.AF_INET):
            networks.append(ipaddress.IPv4Network(
                f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}", strict=False))
        for route in ipr.get_routes(family=socket.AF_INET):
            dst = route.get_attr("RTA_DST")
            if dst and route["dst_len"] > 0:
                networks.append(ipaddress.IPv4Network(f"{dst}/{route['dst_len']}", strict=False))
    return networks
