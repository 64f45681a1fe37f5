"""What `netsim-ddp host` puts on a real NIC: the job's traffic shaped, the rest left alone.

Without peers (every packet is the job's): tbf at the root, netem above it when the link has
delay, jitter or loss. With the job's peers (the other hosts' addresses, known from their
hellos before anything is shaped), a classful root sorts what the NIC sends:

    htb NS: (default NS:2)
      class NS:1  <- u32: IPv4 destination is a peer   -> [netem NU:] -> tbf NT: (the link)
      class NS:2  everything else (storage, monitoring, other jobs): at the NIC's own pace

Both classes run at UNSHAPED_BPS, so htb itself limits nothing; the tbf under NS:1 is the
link, and its counters are the job's wire bytes. What the NIC receives is sorted likewise on
its ingress hook: only packets whose IPv4 source is a peer are redirected to the ifb that
shapes them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.plan import QdiscPlan, netem, tbf
from netsim_ddp.scenario.spec import EffectiveLink

# Our qdiscs' handles ("NS", "NT", "NU"): chosen so they cannot be mistaken for the NIC's own.
EGRESS_HANDLE = 0x4E530000
EGRESS_CHILD_HANDLE = 0x4E540000
EGRESS_NETEM_HANDLE = 0x4E550000
PEER_CLASS = EGRESS_HANDLE | 1
REST_CLASS = EGRESS_HANDLE | 2
UNSHAPED_BPS = 10**12  # htb's classes: far above any NIC, so htb never limits
HTB_QUANTUM = 60_000  # bytes a class sends per round; set, since rate / r2q would overflow
ETH_P_IP = 0x0800
IPV4_SOURCE, IPV4_DESTINATION = 12, 16  # offsets in the IPv4 header


class NicPlanError(FabricError):
    """The link cannot be put on this NIC as asked; the message says why."""


@dataclass(frozen=True)
class ClassPlan:
    handle: int
    parent: int
    params: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class FilterPlan:
    """A u32 filter sending IPv4 packets whose address at `offset` is `address`."""

    parent: int
    address: str
    offset: int
    target: int

    @property
    def keys(self) -> list[str]:
        return [f"0x{int(ipaddress.IPv4Address(self.address)):08x}/0xffffffff+{self.offset}"]


@dataclass(frozen=True)
class NicPlan:
    qdiscs: tuple[QdiscPlan, ...]  # the root first: it replaces the NIC's in one call
    classes: tuple[ClassPlan, ...] = ()
    filters: tuple[FilterPlan, ...] = ()
    peers: tuple[str, ...] | None = None  # None: everything the NIC sends is the job's

    @property
    def root(self) -> int:
        return self.qdiscs[0].handle


def link_qdiscs(link: EffectiveLink, netem_available: bool, parent: int | None
                ) -> tuple[QdiscPlan, ...]:
    """The link: tbf, with netem above it when the link has delay, jitter or loss."""
    if not link.impaired:
        return (tbf(link, EGRESS_CHILD_HANDLE if parent else EGRESS_HANDLE, parent),)
    if not netem_available:
        raise NicPlanError(
            "the scenario's link has delay, jitter or loss, which on a real NIC needs the "
            "kernel's netem qdisc (sch_netem, CONFIG_NET_SCH_NETEM), and this kernel has none: "
            "load sch_netem (modprobe sch_netem), or run the scenario without delay, jitter "
            "and loss (the userspace delay line only exists between emulated nodes)")
    if link.jitter_distribution != "uniform":
        raise NicPlanError(f"link.jitter_distribution = {link.jitter_distribution!r} needs "
                           "netem's distribution tables, which pyroute2 cannot load; use "
                           "'uniform'")
    top_handle = EGRESS_NETEM_HANDLE if parent else EGRESS_HANDLE
    top = netem(link, top_handle)
    top = QdiscPlan(top.kind, top.handle, parent, top.params)
    return (top, tbf(link, EGRESS_CHILD_HANDLE, top_handle | 1))


def egress_plan(link: EffectiveLink, netem_available: bool,
                peers: Sequence[str] | None = None) -> NicPlan:
    """The NIC's egress: all of it the link (`peers` None), or only what goes to `peers`."""
    if peers is None:
        return NicPlan(link_qdiscs(link, netem_available, None))
    for peer in peers:
        try:
            ipaddress.IPv4Address(peer)
        except ValueError:
            raise NicPlanError(f"peer address {peer!r} is not IPv4: only IPv4 peers can be "
                               "told apart from the rest of the NIC's traffic") from None
    root = QdiscPlan("htb", EGRESS_HANDLE, None, {"default": REST_CLASS & 0xFFFF})
    unshaped = {"rate": f"{UNSHAPED_BPS}bit", "ceil": f"{UNSHAPED_BPS}bit",
                "quantum": HTB_QUANTUM}
    classes = (ClassPlan(PEER_CLASS, EGRESS_HANDLE, unshaped),
               ClassPlan(REST_CLASS, EGRESS_HANDLE, unshaped))
    filters = tuple(FilterPlan(EGRESS_HANDLE, peer, IPV4_DESTINATION, PEER_CLASS)
                    for peer in peers)
    return NicPlan((root, *link_qdiscs(link, netem_available, PEER_CLASS)), classes, filters,
                   tuple(peers))


def ingress_filters(parent: int, peers: Sequence[str] | None) -> tuple[FilterPlan, ...] | None:
    """Which received packets go to the shaping ifb: those from `peers` (None: all)."""
    if peers is None:
        return None
    return tuple(FilterPlan(parent, peer, IPV4_SOURCE, 0x10000) for peer in peers)
