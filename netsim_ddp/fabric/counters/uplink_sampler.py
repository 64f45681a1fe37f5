"""The racks' uplink drop counters sampled while the ranks train: a slow step whose window
holds drops on an uplink has them as its network evidence (the runner hands them to
measure.attribution as CounterSeries), where the whole run's counters (Fabric.uplink_counters)
only say that the uplinks dropped.

A thread of its own (fabric.sampling), in the switch's namespace, reads each uplink end's root
tbf every SAMPLE_S of host time: at a scale model's k that is SAMPLE_S / k of the target's
time, finer than any step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyroute2 import IPRoute

from netsim_ddp.fabric.counters.qdisc_stats import loss_counts, root_qdisc
from netsim_ddp.fabric.counters.sampling_thread import SAMPLE_S, SamplingThread
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.fabric.plan import FabricPlan


class UplinkSampler(SamplingThread):
    """Samples (CLOCK_MONOTONIC s, drops so far) per uplink end for the block."""

    thread_name = "netsim-ddp-uplinks"

    def __init__(self, plan: FabricPlan, every_s: float = SAMPLE_S):
        super().__init__(every_s)
        self.plan = plan
        self.ends = [(f"r{rack.index} {direction}", ifname) for rack in plan.racks
                     for direction, ifname in (("up", rack.up), ("down", rack.down))]
        self.samples = {name: [] for name, _ in self.ends}

    @property
    def active(self) -> bool:
        return bool(self.ends)

    @contextlib.contextmanager
    def opened(self) -> Iterator[tuple[IPRoute, dict[str, int]]]:
        with netns.entered(self.plan.switch_netns), IPRoute() as ipr:
            yield ipr, {name: ipr.link("get", ifname=ifname)[0]["index"]
                        for name, ifname in self.ends}

    def sample(self, sockets: tuple[IPRoute, dict[str, int]], now: float) -> None:
        ipr, indexes = sockets
        for name, index in indexes.items():
            msg = root_qdisc(ipr, index)
            losses = loss_counts(msg) if msg is not None else None
            if losses is not None:
                self.samples[name].append((now, float(losses[0])))
