"""Fidelity self-check: does the emulated link, not this host's CPU, set the pace?

A bulk TCP flow runs between two nodes for a moment and its goodput is compared with what the
configured rate allows once headers are paid: a full segment carries MTU - 52 bytes of payload
(IP 20, TCP 20, timestamps 12) in MTU + 14 bytes that tc counts (the Ethernet header). A host
that cannot reach, say, 90% of that measures its CPU, not the link, and the run says so.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

from ..scenario import ETHERNET_HEADER
from .core import Fabric, Node

TCP_IP_HEADERS = 52  # IPv4 20 + TCP 20 + timestamp option 12
_CHUNK = 1 << 20

# The sender runs as its own process inside the source node, as a DDP rank would.
_SENDER = """
import socket, sys, time
address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
payload = memoryview(bytearray(1 << 20))
with socket.create_connection((address, port), timeout=10) as s:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.sendall(payload)
"""


def expected_goodput(rate_bps: float, mtu: int) -> float:
    """TCP payload rate a link of `rate_bps` carries with full-sized segments."""
    return rate_bps * (mtu - TCP_IP_HEADERS) / (mtu + ETHERNET_HEADER)


@dataclass(frozen=True)
class GoodputSample:
    source: str
    destination: str
    cap_bps: float  # the slower of the two links' rates
    expected_bps: float  # cap minus header overhead
    goodput_bps: float  # what the flow delivered

    @property
    def fraction(self) -> float:
        return self.goodput_bps / self.expected_bps

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"fraction": self.fraction}


@dataclass(frozen=True)
class FidelityReport:
    samples: tuple[GoodputSample, ...]
    min_fraction: float

    @property
    def worst(self) -> GoodputSample | None:
        return min(self.samples, key=lambda s: s.fraction, default=None)

    @property
    def trusted(self) -> bool:
        return all(sample.fraction >= self.min_fraction for sample in self.samples)

    @property
    def reason(self) -> str:
        worst = self.worst
        if worst is None:
            return "not probed (one node has no link to another)"
        verdict = "trusted" if self.trusted else "UNTRUSTED"
        return (f"{verdict}: {worst.source}->{worst.destination} delivered "
                f"{worst.goodput_bps / 1e6:.0f} Mbit/s of the {worst.expected_bps / 1e6:.0f} "
                f"Mbit/s its {worst.cap_bps / 1e6:.0f} Mbit/s cap allows ({worst.fraction:.1%}; "
                f"needs >= {self.min_fraction:.0%})"
                + ("" if self.trusted else "; this host cannot drive the link, so its results "
                   "would measure the CPU, not the network"))

    def as_dict(self) -> dict[str, object]:
        return {"trusted": self.trusted, "min_fraction": self.min_fraction,
                "reason": self.reason, "samples": [s.as_dict() for s in self.samples]}


def measure_goodput(source: Node, destination: Node, seconds: float = 1.0,
                    warmup: float = 0.25) -> float:
    """Bits per second of TCP payload from `source` to `destination`, after a warm-up
    that lets slow start and tbf's initial burst pass."""
    listener = destination.socket()
    listener.bind((destination.address, 0))
    listener.listen(1)
    listener.settimeout(15)
    port = listener.getsockname()[1]
    sender = source.popen([sys.executable, "-c", _SENDER, destination.address, str(port),
                           str(seconds + warmup)], stderr=subprocess.PIPE)
    marks: list[tuple[float, int]] = []

    def receive() -> None:
        with listener, listener.accept()[0] as conn:
            buffer = bytearray(_CHUNK)
            total = 0
            while received := conn.recv_into(buffer):
                total += received
                marks.append((time.monotonic(), total))

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    try:
        _, err = sender.communicate(timeout=seconds + warmup + 20)
    except subprocess.TimeoutExpired:
        sender.kill()
        raise RuntimeError(f"goodput probe {source.name}->{destination.name} hung") from None
    receiver.join(timeout=10)
    if sender.returncode != 0 or len(marks) < 2:
        raise RuntimeError(f"goodput probe {source.name}->{destination.name} failed: "
                           f"{err.decode(errors='replace').strip()[-500:]}")
    start = next((m for m in marks if m[0] >= marks[0][0] + warmup), marks[0])
    end = marks[-1]
    return (end[1] - start[1]) * 8 / max(end[0] - start[0], 1e-9)


def probe_pairs(fabric: Fabric) -> list[tuple[Node, Node]]:
    """Node 0 to node 1, plus each node with an overridden link in both directions."""
    nodes = fabric.nodes
    if len(nodes) < 2:
        return []
    pairs = [(nodes[0], nodes[1])]
    overridden = {fabric.node(o.node).index for o in fabric.scenario.link.override}
    for node in nodes:
        if node.index in overridden:
            other = nodes[1] if node.index == 0 else nodes[0]
            for pair in ((node, other), (other, node)):
                if pair not in pairs:
                    pairs.append(pair)
    return pairs


def check_fidelity(fabric: Fabric, seconds: float | None = None,
                   min_fraction: float | None = None) -> FidelityReport:
    config = fabric.scenario.fidelity
    seconds = config.probe_duration if seconds is None else seconds
    samples = []
    for source, destination in probe_pairs(fabric):
        cap = min(source.plan.link.rate, destination.plan.link.rate)
        mtu = min(source.plan.link.mtu, destination.plan.link.mtu)
        goodput = measure_goodput(source, destination, seconds)
        samples.append(GoodputSample(source.name, destination.name, cap,
                                     expected_goodput(cap, mtu), goodput))
    return FidelityReport(tuple(samples),
                          config.min_fraction if min_fraction is None else min_fraction)
