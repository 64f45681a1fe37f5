"""The kernel's TCP counters of the network namespace the calling thread is in.

/proc/thread-self/net/{snmp,netstat} show the calling thread's namespace (/proc/self/net follows
the process's first thread, and setns is per thread). A rank reads them at its measured window's
edges (workload.window), next to its link's byte counters: the difference is what TCP did in
the node during the window (the node's background flows included).
"""

from __future__ import annotations

from pathlib import Path

PROC_NET = Path("/proc/thread-self/net")
MARK_PREFIX = "tcp."  # how the counters sit in a rank's link marks: "tcp.RetransSegs"

# The counters a result records, by the kernel's names (include/uapi/linux/snmp.h), and what
# each one says. Tcp: from snmp, TcpExt: from netstat.
COUNTERS: dict[str, str] = {
    "OutSegs": "segments sent (all)",
    "RetransSegs": "segments retransmitted",
    "TCPTimeouts": "retransmission timeouts (RTO expiries)",
    "TCPSpuriousRTOs": "RTOs that F-RTO found spurious (the segment had arrived)",
    "TCPLossProbes": "tail loss probes sent",
    "TCPLossProbeRecovery": "losses a tail loss probe recovered",
    "TCPFastRetrans": "fast retransmits (loss found by SACK/dupacks, no timeout)",
    "TCPSlowStartRetrans": "retransmits sent in slow start after a timeout",
    "TCPLostRetransmit": "retransmits that were lost again",
    "DelayedACKs": "delayed ACKs sent (the delayed-ACK timer fired)",
    "TCPHystartTrainDetect": "HyStart exits from slow start by ACK train length",
    "TCPHystartDelayDetect": "HyStart exits from slow start by RTT increase",
}
LOSS_EVIDENCE = ("RetransSegs", "TCPTimeouts", "TCPSpuriousRTOs", "TCPLossProbes")


def _parse(text: str, tables: tuple[str, ...]) -> dict[str, int]:
    """The `Name: key key ...` / `Name: value value ...` line pairs of snmp or netstat."""
    found: dict[str, int] = {}
    lines = text.splitlines()
    for header, values in zip(lines[::2], lines[1::2], strict=False):
        table, _, names = header.partition(":")
        if table not in tables:
            continue
        for name, value in zip(names.split(), values.partition(":")[2].split(), strict=False):
            if name in COUNTERS:
                found[name] = int(value)
    return found


def read_tcp_counters(proc_net: Path = PROC_NET) -> dict[str, int]:
    """COUNTERS as the calling thread's network namespace has them now (those the kernel
    has; an older kernel lacks some)."""
    counters = _parse((proc_net / "snmp").read_text(), ("Tcp",))
    counters.update(_parse((proc_net / "netstat").read_text(), ("TcpExt",)))
    return counters


def loss_counters() -> dict[str, int]:
    """LOSS_EVIDENCE as the calling thread's namespace has them now: what a node's local rank 0
    reads at every measured step's edges, so a slow step can name the losses inside it."""
    counters = read_tcp_counters()
    return {name: counters[name] for name in LOSS_EVIDENCE if name in counters}


def tcp_mark() -> dict[str, float]:
    """The counters as entries of a link mark (MARK_PREFIX + name)."""
    return {MARK_PREFIX + name: float(value) for name, value in read_tcp_counters().items()}
