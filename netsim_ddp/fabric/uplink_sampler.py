"""The racks' uplink drop counters sampled while the ranks train: a slow step whose window
holds drops on an uplink has them as its network evidence (the runner hands them to
measure.attribution as CounterSeries), where the whole run's counters (Fabric.uplink_counters)
only say that the uplinks dropped.

A thread of its own, in the switch's namespace with a netlink socket of its own (the fabric's
are the main thread's), reads each uplink end's root tbf every SAMPLE_S of host time: at a
scale model's k that is SAMPLE_S / k of the target's time, finer than any step."""

from __future__ import annotations

import contextlib
import threading
import time

from pyroute2 import IPRoute

from . import netns
from .plan import FabricPlan
from .qdisc_stats import loss_counts, root_qdisc

SAMPLE_S = 0.05


class UplinkSampler(contextlib.AbstractContextManager):
    """Samples (CLOCK_MONOTONIC s, drops so far) per uplink end for the block."""

    def __init__(self, plan: FabricPlan, every_s: float = SAMPLE_S):
        self.plan, self.every_s = plan, every_s
        self.ends = [(f"r{rack.index} {direction}", ifname) for rack in plan.racks
                     for direction, ifname in (("up", rack.up), ("down", rack.down))]
        self.samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in self.ends}
        self.error: str | None = None  # why sampling stopped early, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netsim-ddp-uplinks",
                                        daemon=True)

    def __enter__(self) -> UplinkSampler:
        if self.ends:
            self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            with netns.entered(self.plan.switch_netns), IPRoute() as ipr:
                indexes = {name: ipr.link("get", ifname=ifname)[0]["index"]
                           for name, ifname in self.ends}
                while True:
                    for name, index in indexes.items():
                        msg = root_qdisc(ipr, index)
                        losses = loss_counts(msg) if msg is not None else None
                        if losses is not None:
                            self.samples[name].append((time.monotonic(), float(losses[0])))
                    if self._stop.wait(self.every_s):
                        return
        except Exception as exc:  # the switch went away under us: keep what was read
            self.error = f"{type(exc).__name__}: {exc}"
