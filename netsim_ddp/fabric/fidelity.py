"""Fidelity self-check: does the emulated link, not this host's CPU, set the pace?

A bulk TCP flow runs between two nodes for a moment and its goodput is compared with what the
configured rate allows once headers are paid: a full segment carries MTU - 52 bytes of payload
(IP 20, TCP 20, timestamps 12) in MTU + 14 bytes that tc counts (the Ethernet header). A host
that cannot reach, say, 90% of that measures its CPU, not the link, and the run says so.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from netsim_ddp.fabric.emulated_network import Fabric, Node
from netsim_ddp.scenario.racks import ring_caps
from netsim_ddp.scenario.units import header_factor

if TYPE_CHECKING:
    from netsim_ddp.scenario import Scenario

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
    return rate_bps / header_factor(mtu)


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


# The receiver: prints its port, then, once the sender is done, the goodput after the warm-up.
_RECEIVER = """
import socket, sys, time
address, warmup = sys.argv[1], float(sys.argv[2])
listener = socket.create_server((address, 0))
print(listener.getsockname()[1], flush=True)
listener.settimeout(30)
conn, _ = listener.accept()
buffer = bytearray(1 << 20)
total, first, mark = 0, None, None
while received := conn.recv_into(buffer):
    now = time.monotonic()
    first = first or now
    total += received
    if mark is None and now >= first + warmup:
        mark = (now, total)
    last = (now, total)
if mark is None or last[0] <= mark[0]:
    sys.exit("too little data after the warm-up")
print((last[1] - mark[1]) * 8 / (last[0] - mark[0]), flush=True)
"""


def measure_goodputs(pairs: list[tuple[Node, Node]], seconds: float = 1.0,
                     warmup: float = 0.25) -> list[float]:
    """Bits per second of TCP payload of each (source, destination) flow, all running at once,
    after a warm-up that lets slow start and tbf's initial burst pass."""
    receivers, ports, senders = [], [], []
    try:
        for _, destination in pairs:
            receivers.append(destination.popen(
                [sys.executable, "-c", _RECEIVER, destination.address, str(warmup)],
                stdout=subprocess.PIPE, text=True))
            stdout = receivers[-1].stdout
            assert stdout is not None  # piped above
            ports.append(stdout.readline().strip())  # listening: ready
            if not ports[-1]:
                raise RuntimeError(f"goodput probe receiver in {destination.name} did not start")
        for (source, destination), port in zip(pairs, ports, strict=True):
            senders.append(source.popen([sys.executable, "-c", _SENDER, destination.address,
                                         port, str(seconds + warmup)], stderr=subprocess.PIPE))
        results = []
        for (source, destination), sender, receiver in zip(pairs, senders, receivers,
                                                            strict=True):
            _, err = sender.communicate(timeout=seconds + warmup + 30)
            out, _ = receiver.communicate(timeout=30)
            if sender.returncode != 0 or receiver.returncode != 0:
                raise RuntimeError(f"goodput probe {source.name}->{destination.name} failed: "
                                   f"{err.decode(errors='replace').strip()[-500:]}")
            results.append(float(out.strip()))
        return results
    finally:
        for process in senders + receivers:
            if process.poll() is None:
                process.kill()
                process.wait()


def measure_goodput(source: Node, destination: Node, seconds: float = 1.0,
                    warmup: float = 0.25) -> float:
    """Bits per second of TCP payload of one flow from `source` to `destination`."""
    return measure_goodputs([(source, destination)], seconds, warmup)[0]


def probe_pairs(fabric: Fabric) -> list[tuple[Node, Node]]:
    """A ring: each node sends to the next while receiving from the previous, all at once.

    That is what a ring all-reduce does to the links and to the host: every link busy in both
    directions. A single flow would flatter a host that cannot carry all of them together.
    """
    nodes = fabric.nodes
    if len(nodes) < 2:
        return []
    return [(node, nodes[(node.index + 1) % len(nodes)]) for node in nodes]


def check_fidelity(fabric: Fabric, seconds: float | None = None,
                   min_fraction: float | None = None) -> FidelityReport:
    config = fabric.scenario.fidelity
    seconds = config.probe_duration if seconds is None else seconds
    pairs = probe_pairs(fabric)
    samples = []
    goodputs = measure_goodputs(pairs, seconds)
    caps = ring_caps(fabric.scenario)  # pairs are that ring, node i -> i + 1
    for (source, destination), goodput in zip(pairs, goodputs, strict=True):
        cap = caps[source.index]
        mtu = min(source.plan.link.mtu, destination.plan.link.mtu)
        samples.append(GoodputSample(source.name, destination.name, cap,
                                     expected_goodput(cap, mtu), goodput))
    return FidelityReport(tuple(samples),
                          config.min_fraction if min_fraction is None else min_fraction)


def slowest_link_goodput(scenario: Scenario) -> tuple[float, float]:
    """(rate, TCP goodput) of the slowest node link, bits/s; behind racks' uplinks, of the
    ring's slowest hop (a ring all-reduce moves at its pace)."""
    links = [scenario.link_for(i) for i in range(scenario.topology.nodes)]
    slowest = min(links, key=lambda link: expected_goodput(link.rate, link.mtu))
    rate = min([slowest.rate, *ring_caps(scenario)])
    return rate, expected_goodput(rate, slowest.mtu)
