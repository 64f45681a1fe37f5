"""Did a mode's collectives really cross the emulated links? What they should have sent, from
what the backend's all-reduce does, against what the shaping qdiscs counted.

Only bytes between nodes reach a node's `eth0` qdisc: ranks of one node that talk to each other
(gloo: TCP to the node's own address, which Linux routes over `lo`; NCCL: shared memory or P2P)
never touch it. So the expectation is the all-reduce's cross-node traffic:

- gloo all-reduces in one ring over every rank, in rank order; torchrun numbers a node's ranks
  consecutively, so the ring crosses from node to node N times, and each hop carries what every
  ring hop carries, 2(W-1)/W x S for W ranks and S bytes: N x 2(W-1)/W x S in all.
- NCCL sees each emulated node as a host (distinct NCCL_HOSTID) and builds its rings node by
  node too: the same N x 2(W-1)/W x S. It may pick its tree instead, whose node-level
  double binary tree sends 2(N-1) x S across nodes. The lower of the two is the expectation:
  it is also the least any all-reduce between N nodes can send (2(N-1)/N x S per node).

A bypass (a route or interface the fabric does not shape, NCCL seeing one host and using shared
memory) leaves the links with a fraction of that; the guard fails such a mode.
"""

from __future__ import annotations

from dataclasses import dataclass

from netsim_ddp.scenario.units import header_factor

MIN_FRACTION = 0.9  # counted / expected below this: the traffic went another way


@dataclass(frozen=True)
class CrossNodeExpectation:
    """What one synced step's all-reduce should put on the links between nodes."""

    backend: str
    nodes: int
    ranks_per_node: int
    gradient_bytes: int  # one rank's bytes handed to all-reduce per step (S)
    payload_bytes: float  # across all links, TCP payload
    wire_bytes: float  # the same with TCP/IP/Ethernet headers
    algorithm: str  # how the expectation was derived, for people

    def describe(self) -> str:
        return (f"a {self.backend} {self.algorithm} all-reduce of {self.gradient_bytes / 1e6:.2f} "
                f"MB over {self.nodes} nodes x {self.ranks_per_node} ranks")


def expected_cross_node(backend: str, nodes: int, ranks_per_node: int, gradient_bytes: int,
                        mtu: int) -> CrossNodeExpectation:
    """See the module docstring; zero for a single node (nothing crosses a link)."""
    world = nodes * ranks_per_node
    ring = nodes * 2 * (world - 1) / world * gradient_bytes if nodes > 1 else 0.0
    payload, algorithm = ring, "ring"
    if backend == "nccl" and nodes > 1:
        tree = 2 * (nodes - 1) * gradient_bytes
        if tree < ring:
            payload, algorithm = tree, "tree (or ring)"
    return CrossNodeExpectation(backend, nodes, ranks_per_node, gradient_bytes, payload,
                                payload * header_factor(mtu), algorithm)


@dataclass(frozen=True)
class CrossingVerdict:
    mode: str
    expectation: CrossNodeExpectation
    counted_bytes: float  # per iteration, on the shaped links, background subtracted

    @property
    def fraction(self) -> float:
        wire = self.expectation.wire_bytes
        return self.counted_bytes / wire if wire else 1.0

    @property
    def passed(self) -> bool:
        return self.fraction >= MIN_FRACTION

    @property
    def detail(self) -> str:
        expected = self.expectation.wire_bytes / 1e6
        counted = self.counted_bytes / 1e6
        if self.passed:
            return (f"{self.mode}: {counted:.2f} MB per iteration crossed the emulated links, "
                    f"{self.fraction:.2f} x the {expected:.2f} MB {self.expectation.describe()} "
                    f"sends between nodes, headers included (needs >= {MIN_FRACTION:.2f} x)")
        return (f"{self.mode}: the traffic did not cross the emulated network: expected "
                f"{expected:.2f} MB per iteration between nodes ({self.expectation.describe()}, "
                f"headers included), counted {counted:.2f} MB on the shaped links "
                f"({self.fraction:.2f} x, needs >= {MIN_FRACTION:.2f} x). Likely cause: the "
                "ranks reached each other another way than the nodes' eth0: a route or interface "
                "the fabric does not shape (GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME naming "
                "another interface), or NCCL treating the nodes as one host and using shared "
                "memory or P2P (check NCCL_HOSTID)")
