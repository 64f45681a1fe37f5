"""The kernel's evidence of loss in a mode's measured window, per node: how much each of the
node's TCP counters (fabric.tcp_counters) grew between the window's edges, as the node's local
rank 0 read them inside the node's namespace."""

from __future__ import annotations

from collections.abc import Mapping

from netsim_ddp.fabric.counters.tcp_counters import LOSS_EVIDENCE, MARK_PREFIX
from netsim_ddp.measure.document import TcpCountersRecord
from netsim_ddp.workload.contract.mode_result import ModeResult


def tcp_counters(result: ModeResult) -> list[TcpCountersRecord] | None:
    """Per node (its local rank 0's marks), each counter's growth over the window; None when
    no node read them (results written before the counters were recorded)."""
    records = []
    for rank in result.ranks:
        if not rank.link_marks or len(rank.link_marks) != 2:
            continue
        start, end = rank.link_marks
        counters = {key[len(MARK_PREFIX):]: int(end[key] - start[key])
                    for key in end if key.startswith(MARK_PREFIX) and key in start}
        if counters:
            records.append(TcpCountersRecord(rank=rank.rank, hostname=rank.hostname,
                                             node_rank=rank.node_rank, counters=counters))
    return records or None


def totals(records: list[TcpCountersRecord] | None) -> dict[str, int]:
    """Every node's growth added up, per counter."""
    summed: dict[str, int] = {}
    for record in records or []:
        for name, value in record.counters.items():
            summed[name] = summed.get(name, 0) + value
    return summed


def loss_summary(records: list[TcpCountersRecord] | None) -> str | None:
    """'RetransSegs 12, TCPTimeouts 2' for the loss counters that grew (None: none did)."""
    summed = totals(records)
    grew = [f"{name} {summed[name]}" for name in LOSS_EVIDENCE if summed.get(name)]
    return ", ".join(grew) if grew else None


def rto_dilated(settings: Mapping[str, Mapping[str, str | int]], target_rto_min_s: float,
                k: float) -> bool:
    """Did every node's namespace hold a minimum RTO of at least the target's x k (the sysctl,
    or a locked route metric where the kernel has no sysctl)?"""
    if not settings:
        return False
    want_us = target_rto_min_s * k * 1e6 * 0.999  # the kernel rounds to whole us (ms on routes)
    for node in settings.values():
        sysctl = int(node.get("tcp_rto_min_us", 0))
        route = int(node.get("route:RTAX_RTO_MIN", 0)) * 1000
        if max(sysctl, route) < want_us:
            return False
    return True
