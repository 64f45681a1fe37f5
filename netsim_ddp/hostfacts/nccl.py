"""NCCL confined to the emulated NIC between nodes, and proof from its own log that it was.

NCCL decides that two ranks share a host from the hostname and boot id, which every network
namespace of one machine shares: it would join the emulated nodes through shared memory or P2P
and never touch their links. Per node the harness sets a distinct NCCL_HOSTID (each node is a
host to NCCL, which also lets two nodes share one GPU), pins the network to the socket
transport on eth0 with InfiniBand off, and asks for NCCL's INIT and NET log lines. Within a node,
NCCL uses what a real node has (P2P, shared memory).

Then it reads those lines (`verify_transport`): every channel between ranks of different nodes
must go "via NET/Socket", over eth0 only, and NCCL must count as many nodes as the scenario
has. Anything else refuses the run with the lines that show it.

Format strings, from NCCL's sources (src/transport/net.cc, net_socket.cc, p2p.cc, shm.cc,
init.cc), as they appear after NCCL's "host:pid:tid [dev] NCCL INFO " prefix:
    NET/Socket : Using [0]eth0:10.1.1.1<0>
    Using network Socket
    comm 0x... rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
    Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
    Channel 00/0 : 1[1] -> 0[0] via P2P/IPC/read          (P2P/direct pointer, P2P/CUMEM/...)
    Channel 00 : 2[1] -> 0[0] via SHM/direct/direct

No torch here: the harness builds the environment and reads the logs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NODE_IFNAME = "eth0"
DEBUG_SUBSYSTEMS = ("INIT", "NET")
EVIDENCE_LINES = 6  # lines quoted in a refusal


def node_env(run_id: str, node_name: str, ifname: str = NODE_IFNAME) -> dict[str, str]:
    """What one node's ranks get; the same for every rank of the node. `ifname`: the NIC
    between nodes (eth0 of an emulated node; `netsim-ddp host --nic` on a real host)."""
    return {
        "NCCL_HOSTID": f"netsim-ddp-{run_id}-{node_name}",  # a host of its own to NCCL
        "NCCL_SOCKET_IFNAME": f"={ifname}",  # '=': exactly that NIC, not a prefix
        "NCCL_IB_DISABLE": "1",  # InfiniBand and RoCE: tc never sees them
        "NCCL_NET": "Socket",  # NCCL's own socket transport, no external net plugin
        "NCCL_MNNVL_ENABLE": "0",  # NVLink across hosts (NVL72-class) would bypass the NIC
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": ",".join(DEBUG_SUBSYSTEMS),
    }


# Users' NCCL_* settings that would take the traffic off the emulated links or hide the
# evidence, and why. Everything else (NCCL_ALGO, NCCL_PROTO, NCCL_BUFFSIZE, NCCL_NTHREADS,
# NCCL_MIN/MAX_NCHANNELS, NCCL_NSOCKS_PERTHREAD, NCCL_SOCKET_NTHREADS, NCCL_P2P_*, NCCL_SHM_*,
# ...) passes through: it tunes NCCL without moving traffic off the links.
_OWNED = {
    "NCCL_HOSTID": "the harness gives each emulated node its own host id, so NCCL does not "
                   "join the nodes through shared memory or P2P",
    "NCCL_SOCKET_IFNAME": "traffic between nodes must use the shaped NIC (an emulated node's "
                          "eth0, or `netsim-ddp host --nic`)",
    "NCCL_NET_PLUGIN": "an external network plugin could carry traffic off the emulated links",
    "NCCL_COMM_ID": "NCCL's bootstrap must run over the emulated network",
    "NCCL_DEBUG_FILE": "the harness reads NCCL's log lines from the ranks' output to verify the "
                       "transport",
    "NCCL_TOPO_FILE": "a topology file can declare NICs and links the emulated nodes do not have",
    "NCCL_GRAPH_FILE": "a graph file can force channels that bypass the emulated NIC",
}
_ALLOWED_VALUES = {
    "NCCL_IB_DISABLE": ({"1"}, "InfiniBand/RoCE would bypass the emulated links"),
    "NCCL_NET": ({"Socket"}, "only NCCL's socket transport runs over the emulated NIC"),
    "NCCL_COLLNET_ENABLE": ({"0"}, "CollNet offloads reductions to the network hardware"),
    "NCCL_MNNVL_ENABLE": ({"0"}, "multi-node NVLink would carry traffic between nodes off "
                                 "the shaped NIC"),
    "NCCL_NVLS_ENABLE": ({"0"}, "NVLink SHARP offloads reductions to the NVLink switches"),
    "NCCL_SOCKET_FAMILY": ({"AF_INET"}, "the emulated nodes have IPv4 addresses only"),
    "NCCL_DEBUG": ({"INFO", "TRACE"}, "the harness needs NCCL's INFO lines to verify the "
                                      "transport"),
}


def refused_user_settings(environ: Mapping[str, str]) -> list[str]:
    """One reason per NCCL_* variable in `environ` that would break the emulation."""
    reasons = []
    for name, value in sorted(environ.items()):
        if name in _OWNED:
            reasons.append(f"{name}={value}: {_OWNED[name]}; unset it")
        elif name in _ALLOWED_VALUES:
            allowed, why = _ALLOWED_VALUES[name]
            if value.strip() not in allowed and value.strip().upper() not in allowed:
                reasons.append(f"{name}={value}: {why}; unset it or use "
                               + " or ".join(sorted(allowed)))
    return reasons


# NCCL picks ring or tree, and a protocol, per message size; with several ranks per node their
# bytes between nodes differ by up to 1.75x (fp16 buckets are half the size, so a mode may get
# another algorithm than fp32): pinned, so the wire bytes are what the ring predicts, unless
# the user chose.
PINNED = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def pinned_by_harness(environ: Mapping[str, str]) -> dict[str, str]:
    """What the harness pins (the user's own NCCL_ALGO / NCCL_PROTO win)."""
    return {name: value for name, value in PINNED.items() if not environ.get(name)}


def merged_env(environ: Mapping[str, str], run_id: str, node_name: str,
               ifname: str = NODE_IFNAME) -> dict[str, str]:
    """The node's NCCL settings over the user's harmless ones; the debug subsystems the
    harness needs are added to any the user asked for; ring and the simple protocol unless
    the user set NCCL_ALGO or NCCL_PROTO."""
    env = node_env(run_id, node_name, ifname) | pinned_by_harness(environ)
    user = [s for s in environ.get("NCCL_DEBUG_SUBSYS", "").split(",") if s.strip()]
    if user:
        env["NCCL_DEBUG_SUBSYS"] = ",".join(dict.fromkeys([*user, *DEBUG_SUBSYSTEMS]))
    if environ.get("NCCL_DEBUG", "").upper() == "TRACE":
        env["NCCL_DEBUG"] = "TRACE"
    return env


# --- the log -------------------------------------------------------------------------------

_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket : Using(?P<ifaces>(?: \[\d+\][^:\s]+:\S+)+)")
_IFACE = re.compile(r"\[\d+\](?P<name>[^:\s]+):(?P<address>\S+)")
_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>\S+)")
_COMM = re.compile(r"NCCL INFO comm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nRanks (?P<ranks>\d+) "
                   r"nNodes (?P<nodes>\d+)")
_CHANNEL = re.compile(r"NCCL INFO Channel (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)\[[0-9a-fA-F]+\]"
                      r" -> (?P<dst>\d+)\[[0-9a-fA-F]+\] (?:\[(?:send|receive)\] )?"
                      r"via (?P<via>.+?)\s*$")
_VERSION = re.compile(r"NCCL INFO NCCL version (?P<version>\S+)")


@dataclass
class TransportEvidence:
    """What NCCL's log says about how the ranks were joined, judged against the scenario."""

    nodes: int
    ranks_per_node: int
    ifname: str = NODE_IFNAME  # the NICs allowed, comma-separated (hosts may name theirs apart)
    interfaces: set[str] = field(default_factory=set)  # from "NET/Socket : Using ..."
    networks: set[str] = field(default_factory=set)  # from "Using network ..."
    nccl_nodes: set[int] = field(default_factory=set)  # nNodes NCCL counted
    cross_node: dict[str, list[str]] = field(default_factory=dict)  # transport -> lines
    version: str | None = None
    problems: list[str] = field(default_factory=list)
    rank_nodes: Sequence[int] | None = None  # node of each global rank, if not consecutive

    def node_of(self, rank: int) -> int:
        if self.rank_nodes is not None:
            return self.rank_nodes[rank]
        return rank // self.ranks_per_node  # torchrun numbers a node's ranks consecutively

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def transports(self) -> list[str]:
        """Between nodes, e.g. ['NET/Socket/0']."""
        return sorted(self.cross_node)

    def summary(self) -> str:
        if not self.ok:
            return "; ".join(self.problems)
        return (f"NCCL {self.version or '(version not logged)'} joined the "
                f"{self.nodes} nodes via {', '.join(self.transports)} on "
                f"{', '.join(sorted(self.interfaces))} (NCCL counted "
                f"{', '.join(map(str, sorted(self.nccl_nodes))) or '?'} nodes)")

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "summary": self.summary(), "version": self.version,
                "interfaces": sorted(self.interfaces), "networks": sorted(self.networks),
                "nccl_nodes": sorted(self.nccl_nodes),
                "cross_node_transports": self.transports, "problems": self.problems,
                "evidence": [lines[0] for lines in self.cross_node.values()]}


def verify_transport(lines: Iterable[str], nodes: int, ranks_per_node: int,
                     ifname: str = NODE_IFNAME,
                     rank_nodes: Sequence[int] | None = None) -> TransportEvidence:
    """Read NCCL's INFO lines (from any number of ranks, any prefix) and judge them.
    `rank_nodes` gives each global rank's node where ranks are not numbered node by node."""
    evidence = TransportEvidence(nodes, ranks_per_node, ifname, rank_nodes=rank_nodes)
    wrong_ifaces: list[str] = []
    for line in lines:
        line = line.rstrip("\n")
        if "NCCL INFO" not in line:
            continue
        if match := _SOCKET_USING.search(line):
            names = {m["name"] for m in _IFACE.finditer(match["ifaces"])}
            evidence.interfaces |= names
            if len(names) != 1 or not names <= set(ifname.split(",")):
                wrong_ifaces.append(line.strip())
        elif match := _NETWORK.search(line):
            evidence.networks.add(match["name"])
        elif match := _COMM.search(line):
            evidence.nccl_nodes.add(int(match["nodes"]))
        elif match := _CHANNEL.search(line):
            if evidence.node_of(int(match["src"])) != evidence.node_of(int(match["dst"])):
                evidence.cross_node.setdefault(match["via"], []).append(line.strip())
        elif match := _VERSION.search(line):
            evidence.version = match["version"]
    _judge(evidence, wrong_ifaces)
    return evidence


def _judge(evidence: TransportEvidence, wrong_ifaces: list[str]) -> None:
    problems = evidence.problems
    if evidence.nodes < 2:
        return  # nothing crosses a link: nothing to verify
    other = {via: found for via, found in evidence.cross_node.items()
             if not via.startswith("NET/Socket/")}
    for via, found in other.items():
        problems.append(f"NCCL joined ranks of different nodes via {via}, not NET/Socket: "
                        + " | ".join(found[:EVIDENCE_LINES]))
    if not evidence.cross_node:
        problems.append("NCCL logged no channel between ranks of different nodes (no "
                        "'Channel .. via NET/Socket' line in the ranks' output), so the transport "
                        "between nodes is unverified; are NCCL_DEBUG=INFO and "
                        "NCCL_DEBUG_SUBSYS=INIT,NET reaching the ranks?")
    if wrong_ifaces:
        problems.append(f"NCCL's socket transport uses interfaces other than {evidence.ifname}: "
                        + " | ".join(wrong_ifaces[:EVIDENCE_LINES]))
    elif evidence.cross_node and not evidence.interfaces:
        problems.append(f"NCCL did not log which interface its socket transport uses (no "
                        f"'NET/Socket : Using' line), so {evidence.ifname} is unverified")
    networks = evidence.networks - {"Socket"}
    if networks:
        problems.append(f"NCCL used network {', '.join(sorted(networks))}, not Socket")
    wrong_count = evidence.nccl_nodes - {evidence.nodes}
    if wrong_count:
        problems.append(f"NCCL counted {', '.join(map(str, sorted(wrong_count)))} node(s), the "
                        f"scenario has {evidence.nodes}: it treats emulated nodes as one host "
                        "(same NCCL_HOSTID?) and would join them through shared memory or P2P")


def rank_log_lines(log_dir: Path | str) -> list[str]:
    """Every line the ranks of a launch wrote to stdout and stderr (torchrun's --tee files;
    NCCL writes its INFO lines to stdout)."""
    lines: list[str] = []
    for path in sorted(Path(log_dir).rglob("std*.log")):
        try:
            lines += path.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return lines


def rank_nodes_from_logs(log_dir: Path | str, node_names: Sequence[str],
                         ranks_per_node: int) -> list[int] | None:
    """Each global rank's node, from which node's folder (log_dir/<node name>) holds the
    rank's own "comm ... rank R" line: torchrun's c10d rendezvous numbers ranks in an order of
    its own (the agents' addresses, sorted as strings), not node by node. None when some rank
    of the world is not found (the check then assumes node-by-node numbering)."""
    found: dict[int, int] = {}
    for node, name in enumerate(node_names):
        for line in rank_log_lines(Path(log_dir) / name):
            if match := _COMM.search(line):
                found.setdefault(int(match["rank"]), node)
    ranks = sorted(found)
    if ranks != list(range(len(node_names) * ranks_per_node)):
        return None
    return [found[rank] for rank in ranks]
