"""The delay namespace's kernel side: the undelayed reverse path and link state.

The reverse direction (OUT -> IN) needs no delay, so it stays in the kernel: an ingress qdisc
on OUT with a match-all u32 filter whose mirred action redirects each frame to IN's egress.
It costs no userspace CPU and no copies. (cls_matchall is absent here; u32 with an empty key
matches everything.)
"""

from __future__ import annotations

from pyroute2 import IPRoute

ETH_P_ALL = 0x0003
INGRESS_HANDLE = 0xFFFF0000  # "ffff:"


def link_index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise LookupError(f"no interface {ifname!r} in the delay namespace")
    return int(found[0])


def redirect_reverse_path(ipr: IPRoute, in_index: int, out_index: int) -> None:
    """Every frame arriving on OUT leaves through IN at once (tc ingress + mirred redirect)."""
    ipr.tc("add", "ingress", index=out_index, handle=INGRESS_HANDLE)
    ipr.tc(
        "add-filter", "u32", index=out_index, parent=INGRESS_HANDLE, prio=1,
        protocol=ETH_P_ALL, keys=["0x0/0x0+0"], target=INGRESS_HANDLE | 1,
        action={"kind": "mirred", "direction": "egress", "action": "redirect",
                "ifindex": in_index},
    )


def prepare_delay_namespace(ipr: IPRoute, in_ifname: str, out_ifname: str) -> None:
    """Set up the kernel side of a delay line, given an IPRoute opened in its namespace.

    Both interfaces come up; the reverse path is redirected in the kernel. Offloads stay on:
    the forwarder passes GSO super-packets through intact (PACKET_VNET_HDR) and cuts them
    into wire segments itself only when loss > 0. Nothing needs an address in this namespace.
    """
    in_index, out_index = link_index(ipr, in_ifname), link_index(ipr, out_ifname)
    redirect_reverse_path(ipr, in_index, out_index)
    for index in (in_index, out_index):
        ipr.link("set", index=index, state="up")
