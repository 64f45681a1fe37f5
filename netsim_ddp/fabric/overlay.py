"""One machine's share of a scale model joined to the other machines' shares: a VXLAN device on
the fabric's switch, its underlay this machine's NIC (run/hosts/machine_agent.py).

The device is made in the switch's namespace in one netlink call (IFLA_NET_NS_FD) while its
underlay socket stays in the namespace that made it, the NIC's: nothing is ever added to the
NIC's namespace, and nothing there changes (no address, route or qdisc). It goes with the
switch's namespace, however the run ends. Frames for nodes on other machines are sent, once
per machine, to each machine's NIC address (static all-zero FDB entries: head-end
replication, no multicast on the underlay); the bridge learns where each node is from there.

Each node's link stays shaped at its own veth, so the emulated links remain the bottleneck only
if the underlay carries every node's dilated rate at once: the job's all-reduce probe crosses
the underlay and refuses a run it cannot carry."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.fabric.nic.checks import NicInfo
from netsim_ddp.fabric.plan import FabricPlan

VXLAN_PORT = 4789  # IANA's
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 bytes
OVERLAY_IFNAME = "nsd-vx"  # in the switch's namespace, a port of the fabric's bridge
OVERLAY_INDEX = 2500  # after the node ports (10 + i), before the racks' bridges (2000 + r)
ZERO_MAC = "00:00:00:00:00:00"


class OverlayError(FabricError):
    """The machines cannot be joined as asked; the message names the NIC and the fix."""


def vni_of(job: str) -> int:
    """The job's VXLAN network identifier (24 bits), the same on every machine."""
    return int.from_bytes(hashlib.sha256(job.encode()).digest()[:3], "big") or 1


def check_underlay(nic: NicInfo, mtu: int) -> None:
    """Refuse a NIC that cannot carry the scenario's frames with VXLAN's 50 bytes added:
    fragmented underlay packets would cost the CPU the probe measures, or be dropped."""
    if not nic.addresses:
        raise OverlayError(f"--nic {nic.ifname}: no IPv4 address, so the other machines "
                           "cannot reach this one's emulated nodes through it")
    if nic.mtu < mtu + VXLAN_OVERHEAD:
        raise OverlayError(
            f"--nic {nic.ifname}: its MTU {nic.mtu} cannot carry the scenario's {mtu}-byte "
            f"frames in VXLAN (+{VXLAN_OVERHEAD} bytes): raise the NIC's MTU to at least "
            f"{mtu + VXLAN_OVERHEAD} (jumbo frames), or set link.mtu to at most "
            f"{nic.mtu - VXLAN_OVERHEAD}")


@contextlib.contextmanager
def overlay(plan: FabricPlan, nic: NicInfo, remotes: Sequence[str], job: str) -> Iterator[None]:
    """The VXLAN port on the switch of `plan`'s (built) fabric, flooding to `remotes`' NIC
    addresses; removed on exit. Called from the NIC's namespace."""
    check_underlay(nic, plan.mtu)
    fd = os.open(netns.path_of(plan.switch_netns), os.O_RDONLY)
    try:
        with IPRoute() as underlay:  # this (the NIC's) namespace: the VXLAN's socket stays here
            try:
                underlay.link("add", ifname=OVERLAY_IFNAME, index=OVERLAY_INDEX, kind="vxlan",
                              net_ns_fd=fd, mtu=plan.mtu, vxlan_id=vni_of(job),
                              vxlan_link=nic.index, vxlan_local=nic.addresses[0],
                              vxlan_port=VXLAN_PORT, vxlan_learning=1)
            except NetlinkError as exc:
                raise OverlayError(f"cannot add a VXLAN device over --nic {nic.ifname} "
                                   f"({exc}): the kernel needs the vxlan module, and this "
                                   "process CAP_NET_ADMIN here") from None
    finally:
        os.close(fd)
    try:
        with netns.entered(plan.switch_netns), IPRoute() as switch:
            (bridge,) = switch.link_lookup(ifname=plan.bridge)
            for remote in remotes:
                switch.fdb("append", ifindex=OVERLAY_INDEX, lladdr=ZERO_MAC, dst=remote)
            switch.link("set", index=OVERLAY_INDEX, master=bridge, state="up")
        yield
    finally:
        with netns.entered(plan.switch_netns), IPRoute() as switch, \
                contextlib.suppress(NetlinkError):
            switch.link("del", index=OVERLAY_INDEX)
