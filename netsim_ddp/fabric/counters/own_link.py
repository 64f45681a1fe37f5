"""Counters of the link of the node this process runs in, read from inside it.

Ranks read these at the edges of their measured window, so the wire bytes of a mode count its
measured iterations only: not the rendezvous, the parameter broadcast of DDP's start, the
warm-up, or the results gathered at the end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyroute2 import IPRoute

from netsim_ddp.common.clock import job_clock
from netsim_ddp.fabric import naming
from netsim_ddp.fabric.counters.qdisc_stats import basic_counts, root_qdisc
from netsim_ddp.fabric.nic.job_plan import EGRESS_CHILD_HANDLE, EGRESS_HANDLE

NIC_ENV = "NETSIM_DDP_NIC"  # a real host's shaped NIC (`netsim-ddp host --nic`); else eth0


@dataclass(frozen=True)
class LinkMark:
    """What a node had sent by `monotonic_s` (the job's clock, common.clock: CLOCK_MONOTONIC,
    one clock for all namespaces, shifted onto node 0's across hosts)."""

    monotonic_s: float
    sent_bytes: int
    sent_packets: int


def mark_own_link(ifname: str | None = None) -> LinkMark | None:
    """The bytes this node's shaped NIC has sent, or None if it has no such NIC.

    Only meaningful inside an emulated node or on a host shaped by `netsim-ddp host`: the
    harness tells ranks so (NETSIM_DDP_NODE, and NETSIM_DDP_NIC on a real host)."""
    ifname = ifname or os.environ.get(NIC_ENV) or naming.NODE_IFNAME
    with IPRoute() as ipr:
        links = ipr.link_lookup(ifname=ifname)
        if not links:
            return None
        msg = counted_qdisc(ipr, links[0])
        counts = basic_counts(msg) if msg is not None else None
    return LinkMark(job_clock(), *counts) if counts else None


def counted_qdisc(ipr: IPRoute, index: int):
    """The qdisc whose counters are the node's wire bytes: the root, or, on a real NIC that
    `netsim-ddp host` shapes for the job's peers only (fabric/nic/job_plan.py), the link's tbf
    under the peers' class: the rest of the NIC's traffic is not the job's."""
    root = root_qdisc(ipr, index)
    if root is None or root["handle"] != EGRESS_HANDLE or root.get_attr("TCA_KIND") != "htb":
        return root
    return next((msg for msg in ipr.get_qdiscs(index=index)
                 if msg["handle"] == EGRESS_CHILD_HANDLE), None)


class LinkCounter:
    """This node's shaped NIC, read again and again through one netlink socket (opening one
    costs ~14 ms inside a namespace here: too slow to do at every training step)."""

    def __init__(self, ifname: str | None = None) -> None:
        self._ipr = IPRoute()
        links = self._ipr.link_lookup(ifname=ifname or os.environ.get(NIC_ENV)
                                      or naming.NODE_IFNAME)
        self._index = links[0] if links else None

    def read(self) -> LinkMark | None:
        """What the NIC's counted qdisc (counted_qdisc) has sent so far; None without one."""
        if self._index is None:
            return None
        msg = counted_qdisc(self._ipr, self._index)
        counts = basic_counts(msg) if msg is not None else None
        return LinkMark(job_clock(), *counts) if counts else None

    def close(self) -> None:
        self._ipr.close()
