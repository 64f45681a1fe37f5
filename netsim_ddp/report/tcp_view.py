"""The kernel's TCP evidence as people read it: a short cell for the terminal's mode table, a
per-node table and the settings line for the Markdown/HTML report."""

from __future__ import annotations

from netsim_ddp.measure.document import ScenarioRecord, TcpCountersRecord
from netsim_ddp.measure.tcp_evidence import totals

# Short names for the terminal's cell, in the order they are worth reading.
SHORT = {"RetransSegs": "retx", "TCPTimeouts": "rto", "TCPSpuriousRTOs": "spur",
         "TCPLossProbes": "tlp"}
TABLE_COUNTERS = ("RetransSegs", "TCPTimeouts", "TCPSpuriousRTOs", "TCPLossProbes",
                  "TCPFastRetrans", "DelayedACKs")
HYSTART = ("TCPHystartTrainDetect", "TCPHystartDelayDetect")
TCP_HEADER = ["mode", "node", "retransmitted", "timeouts", "spurious RTOs", "loss probes",
              "fast retransmits", "delayed ACKs", "HyStart exits", "segments sent"]


def loss_cell(records: list[TcpCountersRecord] | None) -> str:
    """e.g. 'retx 12 rto 2' (all nodes); '' when no loss counter grew."""
    summed = totals(records)
    return " ".join(f"{short} {summed[name]}" for name, short in SHORT.items()
                    if summed.get(name))


def tcp_rows(entry: ScenarioRecord) -> list[list[str]]:
    """Per mode and node, the counters' growth in the measured window (empty: none read)."""
    names = (entry.scenario or {}).get("topology", {}).get("names") or []
    rows = []
    for mode, record in entry.modes.items():
        for node in record.tcp_counters or []:
            index = node.node_rank
            label = (names[index] if index is not None and index < len(names)
                     else f"node {index}" if index is not None else f"rank {node.rank}")
            counters = node.counters
            rows.append([mode, label, *(str(counters.get(name, "-")) for name in TABLE_COUNTERS),
                         str(sum(counters.get(name, 0) for name in HYSTART)),
                         str(counters.get("OutSegs", "-"))])
    return rows


def tcp_settings_line(entry: ScenarioRecord) -> str | None:
    """The TCP settings the nodes ran with, as the kernel held them (node 0's; every node gets
    the same), or None where the run did not record them."""
    settings = entry.network.tcp
    if not settings:
        return None
    first = next(iter(settings.values()))
    return ("TCP in every node, as the kernel held it (host units; a scale model's times are "
            "the target's x k): " + ", ".join(f"{name} = {value}" for name, value in
                                             first.items()))
