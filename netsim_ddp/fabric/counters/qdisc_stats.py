"""Reading a qdisc's counters out of pyroute2's netlink messages, in one place: the fabric's
summaries and drain check, the link scheduler's samples and each node's own link marks all
count the bytes tc saw the same way."""

from __future__ import annotations

from typing import Any

from pyroute2.netlink.rtnl import TC_H_ROOT


def basic_counts(msg: Any) -> tuple[int, int] | None:
    """(bytes, packets) the qdisc sent; None where the kernel gave no basic stats."""
    stats = msg.get_attr("TCA_STATS2")
    basic = stats.get_attr("TCA_STATS_BASIC") if stats else None
    return (int(basic["bytes"]), int(basic["packets"])) if basic else None


def queue_length(msg: Any) -> int:
    """Packets waiting in the qdisc (0 without queue stats)."""
    stats = msg.get_attr("TCA_STATS2")
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
    return int(queue["qlen"]) if queue else 0


def loss_counts(msg: Any) -> tuple[int, int] | None:
    """(drops, overlimits) of the qdisc: packets it dropped, and times it held one back."""
    stats = msg.get_attr("TCA_STATS2")
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
    return (int(queue["drops"]), int(queue["overlimits"])) if queue else None


def root_qdisc(ipr: Any, index: int) -> Any | None:
    """The root qdisc's message on interface `index`, or None without one."""
    return next((msg for msg in ipr.get_qdiscs(index=index) if msg["parent"] == TC_H_ROOT),
                None)
