"""The nodes' TCP connections sampled while the ranks train, one by one: which ones
retransmitted, and which had a retransmission timeout, inside a slow step's window. A node's
counters (RankSamples.step_tcp_loss) add up all of its connections, a neighbour job's flows
included; these tell the job's own connections from the neighbour's.

A thread of its own (fabric.sampling) opens one sock_diag socket in each node's namespace (a
netlink socket belongs to the namespace it was made in; pyroute2's DiagSocket) and reads every
connection's tcp_info every SAMPLE_S of host time. A connection is the neighbour's when its
socket belongs to a background flow's process (fabric.background; its inode among that
process's descriptors, looked up once per new connection), else the job's. Per direction (the
sending node's socket towards another node) and kind, two running totals: segments
retransmitted (tcpi_total_retrans) and retransmission timeouts: the kernel's own count
(tcpi_total_rto, Linux 6.7+; pyroute2 does not decode it yet, so it is read at its offset in
the attribute), else entries into the Loss state (tcpi_ca_state, which only a timeout sets).
The Loss state lasts from the timer's firing to the recovery's end, a few round trips, so
sampling misses most of them: on a kernel without the count, timeouts are a lower bound.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pyroute2.netlink.diag import SS_CONN, DiagSocket

from netsim_ddp.fabric.counters.sampling_thread import SAMPLE_S, SamplingThread
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.fabric.plan import FabricPlan

TCP_CA_LOSS = 4  # include/net/tcp.h: the state a retransmission timeout puts a socket in
INET_DIAG_INFO_EXT = 1 << (2 - 1)  # idiag_ext bit of INET_DIAG_INFO (tcp_info)
# include/uapi/linux/tcp.h: struct tcp_info's __u16 tcpi_total_rto (Linux 6.7+), past the
# attribute's 4-byte header
TOTAL_RTO_AT = 4 + 240
BACKGROUND_COMMAND = b"netsim_ddp.fabric.background"


@dataclass
class _Connection:
    direction: tuple[str, int, int]  # (kind, from node, to node)
    retransmitted: int = 0
    timeouts: int = 0
    in_loss: bool = False


class ConnectionSampler(SamplingThread):
    """Per (kind, from, to) and metric, (CLOCK_MONOTONIC s, running total) for the block;
    kind is 'job' or 'neighbour'."""

    thread_name = "netsim-ddp-connections"

    def __init__(self, plan: FabricPlan, every_s: float = SAMPLE_S):
        super().__init__(every_s)
        self.plan = plan
        self._node_of = {node.address: node.index for node in plan.nodes}
        self._connections: dict[tuple[int, int], _Connection] = {}  # (node, inode)
        self._background: set[tuple[int, int]] = set()
        self._previous: float | None = None  # the last sampling round's time

    @contextlib.contextmanager
    def opened(self) -> Iterator[dict[int, DiagSocket]]:
        with contextlib.ExitStack() as stack:
            yield {node.index: stack.enter_context(_diag_socket(node.netns))
                   for node in self.plan.nodes}

    def sample(self, sockets: dict[int, DiagSocket], now: float) -> None:
        for index, diag in sockets.items():
            self._read(index, diag)
        self._record(now)

    def _read(self, index: int, diag: DiagSocket) -> None:
        found = diag.get_sock_stats(family=socket.AF_INET, states=SS_CONN,
                                    extensions=INET_DIAG_INFO_EXT)
        for message in found:
            peer = self._node_of.get(message["idiag_dst"])
            info = message.get_attr("INET_DIAG_INFO")
            if peer is None or peer == index or info is None or not message["idiag_inode"]:
                continue  # loopback, the node's own address, no tcp_info, or orphaned
            key = (index, message["idiag_inode"])
            connection = self._connections.get(key)
            if connection is None:
                if key not in self._background:
                    self._background |= _background_sockets(self.plan, index)
                kind = "neighbour" if key in self._background else "job"
                connection = self._connections[key] = _Connection((kind, index, peer))
            loss = info["tcpi_ca_state"] == TCP_CA_LOSS
            counted = total_rto(info)
            if counted is not None:
                connection.timeouts = max(connection.timeouts, counted)
            else:
                connection.timeouts += int(loss and not connection.in_loss)
            connection.in_loss = loss
            connection.retransmitted = max(connection.retransmitted,
                                           info["tcpi_total_retrans"])

    def _record(self, now: float) -> None:
        totals: dict[str, int] = {}
        for connection in self._connections.values():
            kind, source, destination = connection.direction
            name = f"{kind} n{source}->n{destination}"
            for metric, value in (("retransmitted", connection.retransmitted),
                                  ("timeouts", connection.timeouts)):
                totals[f"{name} {metric}"] = totals.get(f"{name} {metric}", 0) + value
        for name, value in totals.items():
            # From 0 where first seen (a connection's retransmissions before its first sample
            # fall in that sample's window); then the samples either side of each change:
            # CounterSeries.growth reads the first sample after a window's end, which must not
            # be a later change.
            series = self.samples.setdefault(name, [(now, 0.0)])
            if series[-1][1] != value:
                if self._previous is not None and series[-1][0] < self._previous:
                    series.append((self._previous, series[-1][1]))
                series.append((now, value))
        self._previous = now

    def grown(self) -> dict[str, list[tuple[float, float]]]:
        """The series whose total grew during the block (nothing else is evidence)."""
        return {name: points for name, points in self.samples.items() if points[-1][1] > 0}


def total_rto(info) -> int | None:
    """The kernel's count of the connection's retransmission timeouts, where its tcp_info has
    it (None: an older kernel's, or a decoded attribute without its bytes)."""
    length, data = getattr(info, "length", 0), getattr(info, "data", None)
    if data is None or length < TOTAL_RTO_AT + 2:
        return None
    return int(struct.unpack_from("=H", data, info.offset + TOTAL_RTO_AT)[0])


@contextlib.contextmanager
def _diag_socket(namespace: str) -> Iterator[DiagSocket]:
    with netns.entered(namespace):
        diag = DiagSocket()
    try:
        diag.bind()
        yield diag
    finally:
        diag.close()


def _background_sockets(plan: FabricPlan, index: int) -> set[tuple[int, int]]:
    """(node, socket inode) of every socket the node's background flow processes hold."""
    node = plan.nodes[index]
    found = set()
    for pid in netns.pids_in([node.netns])[node.netns]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if BACKGROUND_COMMAND not in handle.read():
                    continue
            for fd in os.scandir(f"/proc/{pid}/fd"):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    found.add((index, int(target[8:-1])))
        except OSError:  # the process ended while we looked
            continue
    return found


__all__ = ["ConnectionSampler", "total_rto"]
