"""Whether this host's NIC can be shaped: the NIC as the kernel shows it, the privileges and
qdiscs shaping needs, checked before anything changes."""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.namespaces import privilege
from netsim_ddp.fabric.nic.tc_tree import scratch_ifb, scratch_name

IFF_UP = 0x1
IFF_LOOPBACK = 0x8


class NicError(FabricError):
    """This NIC cannot be shaped (or restored) as asked; the message says why and what to do."""


@dataclass(frozen=True)
class NicInfo:
    ifname: str
    index: int
    up: bool
    loopback: bool
    mtu: int
    addresses: tuple[str, ...]  # IPv4
    default_route: bool  # carries this namespace's IPv4 default route
    mac: str | None = None
    tx_queues: int = 1
    txqlen: int = 1000


def inspect_nic(ifname: str) -> NicInfo:
    """What this namespace's NIC is; NicError if there is none by that name."""
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            names = sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
            raise NicError(f"--nic {ifname}: no such interface on this host; it has "
                           + ", ".join(names))
        (link,) = ipr.get_links(found[0])
        addresses = tuple(a.get_attr("IFA_ADDRESS")
                          for a in ipr.get_addr(family=socket.AF_INET, index=found[0]))
        default = any(route.get_attr("RTA_OIF") == found[0] and route["dst_len"] == 0
                      for route in ipr.get_routes(family=socket.AF_INET, table=254))
    return NicInfo(ifname=ifname, index=found[0], up=bool(link["flags"] & IFF_UP),
                   loopback=bool(link["flags"] & IFF_LOOPBACK) or ifname == "lo",
                   mtu=link.get_attr("IFLA_MTU"), addresses=addresses, default_route=default,
                   mac=link.get_attr("IFLA_ADDRESS"),
                   tx_queues=link.get_attr("IFLA_NUM_TX_QUEUES") or 1,
                   txqlen=link.get_attr("IFLA_TXQLEN") or 0)


def check_nic(info: NicInfo, peers_only: bool = False) -> list[str]:
    """Refuse what cannot be a cluster NIC; return warnings for what should be looked at.
    `peers_only`: only the job's traffic will be shaped (ShapedNic's peers)."""
    if info.loopback:
        raise NicError(f"--nic {info.ifname}: a loopback interface carries no traffic between "
                       "hosts; name the NIC the hosts reach each other through")
    if not info.up:
        raise NicError(f"--nic {info.ifname}: the interface is down; bring it up or name "
                       "the NIC the hosts reach each other through")
    if not info.addresses:
        raise NicError(f"--nic {info.ifname}: the interface has no IPv4 address, so the "
                       "training cannot be pinned to it")
    if info.default_route and not peers_only:
        return [f"{info.ifname} carries this host's default route: everything the host sends "
                "that way (ssh, storage, monitoring) is shaped too while the run lasts, and "
                "counted in the wire bytes"]
    return []


def check_may_shape(ifname: str) -> None:
    """Refuse, before any agent waits on us, a process that cannot shape this NIC and restore
    it (privilege_problems)."""
    problems = privilege_problems()
    if problems:
        raise NicError(f"--nic {ifname}: shaping this host's NIC needs root or "
                       + " and ".join(problems) + "; a user namespace cannot give that for a "
                       "real NIC: run the agent as root (sudo netsim-ddp host ...)")


def qdisc_available_here(kind: str, **params: Any) -> bool:
    """Does this kernel take a `kind` qdisc? Tried on a scratch veth pair in this very
    namespace (the NIC's): CAP_NET_ADMIN there is all it needs, unlike a probe in a namespace
    of its own (CAP_SYS_ADMIN), which a NET_ADMIN-only pod would fail and read as "no"."""
    name = scratch_name("qp")
    with IPRoute() as ipr:
        try:
            ipr.link("add", ifname=name, kind="veth", peer={"ifname": name + "p"})
        except NetlinkError as exc:
            raise NicError(f"cannot make a scratch veth to probe for {kind} ({exc}): "
                           "netsim-ddp host needs CAP_NET_ADMIN in the NIC's namespace") from None
        try:
            (index,) = ipr.link_lookup(ifname=name)
            ipr.tc("add", kind, index=index, handle=0x10000, **params)
            return True
        except NetlinkError:
            return False
        finally:
            with contextlib.suppress(NetlinkError, IndexError):
                ipr.link("del", index=ipr.link_lookup(ifname=name)[0])


def netem_available_here() -> bool:
    return qdisc_available_here("netem", delay=1000)


def privilege_problems(effective_caps: int | None = None,
                       record_dir: Path | None = None) -> list[str]:
    """What keeps this process from shaping a NIC and restoring it (empty: nothing).
    It needs CAP_NET_ADMIN in the NIC's network namespace (its qdiscs, an ifb and scratch
    devices there) and the right to write the NIC's record where `netsim-ddp clean` looks for
    it (/run/netsim-ddp: root). CAP_SYS_ADMIN is not needed: nothing is made outside the
    NIC's namespace."""
    net_admin = (privilege.has_net_admin() if effective_caps is None
                 else bool(effective_caps >> privilege.CAP_NET_ADMIN & 1))
    record_dir = naming.lock_dir() if record_dir is None else record_dir
    problems = []
    if not net_admin:
        problems.append("CAP_NET_ADMIN in the NIC's network namespace (run as root, or give "
                        "the container NET_ADMIN)")
    existing = next(p for p in (record_dir, *record_dir.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        problems.append(f"write access to {record_dir}, where each NIC's record is kept for "
                        "`netsim-ddp clean` (run as root)")
    return problems


def ifb_available(ipr: IPRoute) -> bool:
    """Try to make an ifb device of a name nobody else holds (and remove it): the only sure
    test. A name another agent's probe or a leftover holds would read as "no ifb"."""
    try:
        with scratch_ifb(ipr, "probe"):
            return True
    except NetlinkError:
        return False
