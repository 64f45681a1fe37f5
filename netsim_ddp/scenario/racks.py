"""What racks do to a ring: each hop's capacity when nodes sit behind oversubscribed uplinks
(`[topology] racks`). Pure: the fabric builds the racks (fabric.plan.plan_racks), the probes
and the all-reduce bound read these caps.

A ring (the fidelity probe's flows, gloo's and NCCL's ring all-reduce: node i sends to node
i + 1) crosses an uplink wherever two neighbours sit in different racks: out of the sender's
rack on its uplink's up direction, into the receiver's on its down direction. Hops that share
an uplink direction share its rate, so a hop gets the least of its two node links and its
share of each uplink it crosses.
"""

from __future__ import annotations

from collections import Counter

from netsim_ddp.scenario.spec import Scenario


def ring_caps(scenario: Scenario) -> list[float]:
    """Hop i (node i -> node i + 1, the last back to node 0): its rate cap, bits/s."""
    topology = scenario.topology
    count = topology.nodes
    rates = [scenario.link_for(i).rate for i in range(count)]
    hops = [(i, (i + 1) % count) for i in range(count)] if count > 1 else []
    caps = [min(rates[a], rates[b]) for a, b in hops]
    if topology.racks == 1 or topology.uplink is None:
        return caps
    rack = topology.node_racks
    crossing = [(a, b) for a, b in hops if rack[a] != rack[b]]
    up = Counter(rack[a] for a, _ in crossing)
    down = Counter(rack[b] for _, b in crossing)
    uplink = topology.uplink.rate
    return [cap if rack[a] == rack[b] else
            min(cap, uplink / up[rack[a]], uplink / down[rack[b]])
            for cap, (a, b) in zip(caps, hops, strict=True)]
