"""Links that change during a run: `[[link.schedule]]`, applied in place at offsets from the
start of every mode's measured window.

Each change rewrites the existing qdiscs with tc "change" (the same handles the build made),
never delete + add: the qdisc object, its queue and its counters live on, so no packet passes
unshaped while a rate moves. A flap (`down`) sets the rate to FLAP_RATE_BPS, then restores
what was there. Both directions of a link change together (node egress and switch port).

A thread follows the same signal files as the background flows
(netsim_ddp.workload.contract.window): at each start-MODE it replays the schedule from the
top, at end-MODE it restores the starting links. It logs each change with its time, and
samples the changed links' qdisc byte counters so a report can show that no change let a
burst above the cap through.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from netsim_ddp.common.signal_files import new_window, window_ended
from netsim_ddp.fabric.counters.qdisc_stats import basic_counts, root_qdisc
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.fabric.plan import NodePlan, QdiscPlan, egress_qdiscs, ingress_qdiscs
from netsim_ddp.scenario.spec import EffectiveLink, Scenario, queue_limit_bytes
from netsim_ddp.scenario.units import ETHERNET_HEADER

FLAP_RATE_BPS = 8_000.0  # a link that is down still needs a valid tbf rate: 1 kB/s
POLL_S = 0.001
SAMPLE_EVERY_S = 0.01
ETH0_INDEX = 2  # in each node's namespace (netsim_ddp.fabric.emulated_network)
FIRST_PORT_INDEX = 10  # switch port of node i


@dataclass(frozen=True)
class LinkStep:
    """One change as applied: at `at` seconds into the window, `node`'s link becomes `link`."""

    at: float
    node: int
    link: EffectiveLink
    label: str  # what people read, e.g. "n1 rate 250Mbit/s"


def _describe(change: Any, name: str) -> str:
    if change.down is not None:
        return f"{name} down {change.down * 1e3:g}ms"
    parts = []
    if change.rate is not None:
        parts.append(f"rate {change.rate / 1e6:g}Mbit/s")
    for field_name, scale, unit in (("delay", 1e3, "ms"), ("jitter", 1e3, "ms")):
        if getattr(change, field_name) is not None:
            parts.append(f"{field_name} {getattr(change, field_name) * scale:g}{unit}")
    if change.loss is not None:
        parts.append(f"loss {change.loss:g}%")
    if change.queue_limit is not None:
        parts.append(f"queue {change.queue_limit}")
    return f"{name} " + ", ".join(parts)


def plan_schedule(scenario: Scenario) -> list[LinkStep]:
    """The scenario's schedule as steps in time order, each with the node's whole new link
    (a flap becomes two steps: down, and back to the link it had)."""
    names = scenario.topology.node_names
    current = {index: scenario.link_for(index) for index in range(len(names))}
    steps: list[LinkStep] = []
    for change in scenario.link.schedule:
        nodes = (range(len(names)) if change.node is None
                 else [change.node if isinstance(change.node, int) else names.index(change.node)])
        for index in nodes:
            before = current[index]
            if change.down is not None:
                steps.append(LinkStep(change.at, index, before.model_copy(
                    update={"rate": FLAP_RATE_BPS}), _describe(change, names[index])))
                steps.append(LinkStep(change.at + change.down, index, before,
                                      f"{names[index]} back up"))
                continue
            update: dict[str, object] = {
                key: getattr(change, key) for key in ("rate", "delay", "jitter", "loss")
                if getattr(change, key) is not None}
            if change.queue_limit is not None:
                update["queue_limit_bytes"] = queue_limit_bytes(
                    change.queue_limit, before.mtu + ETHERNET_HEADER)
            current[index] = before.model_copy(update=update)
            steps.append(LinkStep(change.at, index, current[index],
                                  _describe(change, names[index])))
    return sorted(steps, key=lambda step: step.at)  # stable: entries at one time keep order


def qdisc_changes(node: NodePlan, link: EffectiveLink) -> list[tuple[str, QdiscPlan]]:
    """(namespace role, qdisc) pairs that turn `node`'s link into `link`, with the handles the
    build used, so each is a tc "change" of an existing qdisc."""
    egress = egress_qdiscs(link, node.delay_backend)
    if node.delay_backend == "delay-line":
        egress = tuple(q for q in egress if q.kind != "netem")
    return ([("node", qdisc) for qdisc in egress]
            + [("switch", qdisc) for qdisc in ingress_qdiscs(link)])


def check_applicable(steps: list[LinkStep], nodes: tuple[NodePlan, ...]) -> None:
    """Refuse, before the run, what cannot be changed in place on this host."""
    for step in steps:
        node = nodes[step.node]
        base = node.link
        impairs = (step.link.delay, step.link.jitter, step.link.loss) != (
            base.delay, base.jitter, base.loss)
        if impairs and node.delay_backend != "netem":
            raise FabricError(
                f"link.schedule: {step.label}: changing delay, jitter or loss in place needs "
                f"netem, and node {node.name!r} uses {node.delay_backend or 'no delay stage'} "
                "(this kernel has no netem, or the link starts unimpaired); schedule rate or "
                "queue_limit changes only")


@dataclass
class AppliedChange:
    mode: str
    label: str
    at_s: float  # planned offset in the window
    offset_s: float  # when it was applied, from the window's start
    monotonic_s: float  # CLOCK_MONOTONIC when the change returned

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "label": self.label, "at_s": self.at_s,
                "offset_s": self.offset_s, "monotonic_s": self.monotonic_s}


@dataclass
class ModeWindow:
    """One measured window as the schedule saw it."""

    mode: str
    start_monotonic: float
    end_monotonic: float | None = None
    changes: list[AppliedChange] = field(default_factory=list)
    # Per changed link side: (monotonic s, bytes through its root qdisc) samples.
    counters: dict[str, list[tuple[float, int]]] = field(default_factory=dict)


class LinkScheduler:
    """Replays `steps` in every measured window signalled in `signals`, in its own thread."""

    def __init__(self, nodes: tuple[NodePlan, ...], switch_netns: str, steps: list[LinkStep],
                 signals: Path):
        check_applicable(steps, nodes)
        self.nodes = nodes
        self.switch_netns = switch_netns
        self.steps = steps
        self.signals = signals
        self.windows: list[ModeWindow] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nsd-link-schedule", daemon=True)
        self._changed = sorted({step.node for step in steps})

    def __enter__(self) -> LinkScheduler:
        if self.steps:
            self._thread.start()
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the thread (the links are back at their start); raise what it failed with."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._error is not None:
            error, self._error = self._error, None
            raise FabricError(f"link schedule failed: {error}") from error

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._sockets() as sockets:
                seen: set[str] = set()
                while not self._stop.is_set():
                    mode = self._next_window(seen)
                    if mode is None:
                        return
                    try:
                        self._replay(sockets, mode)
                    finally:
                        for index in self._changed:  # the next window starts where this did
                            self._apply(sockets, index, self.nodes[index].link)
        except BaseException as exc:  # reported by stop(), in the harness's thread
            self._error = exc

    @contextlib.contextmanager
    def _sockets(self) -> Iterator[dict[str, IPRoute]]:
        """Our own netlink sockets: the fabric's are used by the harness's thread."""
        with contextlib.ExitStack() as stack:
            sockets = {}
            for role, namespace in [("switch", self.switch_netns)] + [
                    (f"node{index}", self.nodes[index].netns) for index in self._changed]:
                with netns.entered(namespace):
                    sockets[role] = stack.enter_context(IPRoute())
            yield sockets

    def _next_window(self, seen: set[str]) -> str | None:
        while not self._stop.is_set():
            if (mode := new_window(self.signals, seen)) is not None:
                return mode
            time.sleep(POLL_S)
        return None

    def _replay(self, sockets: dict[str, IPRoute], mode: str) -> None:
        window = ModeWindow(mode, time.monotonic())
        self.windows.append(window)
        pending = list(self.steps)
        next_sample = 0.0
        while not self._stop.is_set() and not window_ended(self.signals, mode):
            now = time.monotonic()
            while pending and now >= window.start_monotonic + pending[0].at:
                step = pending.pop(0)
                self._apply(sockets, step.node, step.link)
                applied = time.monotonic()
                window.changes.append(AppliedChange(mode, step.label, step.at,
                                                    applied - window.start_monotonic, applied))
                now = applied
            if now >= next_sample:
                self._sample(sockets, window)
                next_sample = now + SAMPLE_EVERY_S
            time.sleep(POLL_S)
        window.end_monotonic = time.monotonic()

    def _apply(self, sockets: dict[str, IPRoute], index: int, link: EffectiveLink) -> None:
        for role, qdisc in qdisc_changes(self.nodes[index], link):
            ipr, where = ((sockets[f"node{index}"], ETH0_INDEX) if role == "node"
                          else (sockets["switch"], FIRST_PORT_INDEX + index))
            placement = {"parent": qdisc.parent} if qdisc.parent is not None else {}
            ipr.tc("change", qdisc.kind, index=where, handle=qdisc.handle, **placement,
                   **qdisc.params)

    def _sample(self, sockets: dict[str, IPRoute], window: ModeWindow) -> None:
        now = time.monotonic()
        for index in self._changed:
            name = self.nodes[index].name
            for side, ipr, where in ((f"{name} sends", sockets[f"node{index}"], ETH0_INDEX),
                                     (f"{name} receives", sockets["switch"],
                                      FIRST_PORT_INDEX + index)):
                window.counters.setdefault(side, []).append((now, _root_bytes(ipr, where)))


def _root_bytes(ipr: IPRoute, index: int) -> int:
    msg = root_qdisc(ipr, index)
    if msg is None:
        raise FabricError(f"no root qdisc on interface {index}: the link lost its shaping")
    counts = basic_counts(msg)
    return counts[0] if counts else 0


# -- reading a run against its schedule (pure) ------------------------------------------------

def state_links(scenario: Scenario, steps: list[LinkStep]) -> list[list[EffectiveLink]]:
    """Every node's link in each state: state 0 is the start, state k follows step k."""
    links = [scenario.link_for(index) for index in range(scenario.topology.nodes)]
    states = [list(links)]
    for step in steps:
        links[step.node] = step.link
        states.append(list(links))
    return states


def iteration_states(started: list[float], durations: list[float],
                     changes: list[AppliedChange]) -> list[tuple[int, int]]:
    """Per iteration, (state at its start, state at its end): the number of changes applied
    by then. Equal numbers: the iteration ran under one link state throughout."""
    times = [change.monotonic_s for change in changes]
    return [(sum(t <= start for t in times), sum(t <= start + length for t in times))
            for start, length in zip(started, durations, strict=True)]


def state_label(state: int, changes: list[AppliedChange]) -> str:
    return "initial" if state == 0 else f"{state}: {changes[state - 1].label}"


def max_rate_near(samples: list[tuple[float, int]], when: float, span_s: float = 0.3,
                  window_s: float = 0.05) -> float:
    """The highest rate (bits/s) the counters show over any `window_s` within +-`span_s` of
    `when`; 0 if there are too few samples there."""
    near = [(t, b) for t, b in samples if abs(t - when) <= span_s]
    best, j = 0.0, 0
    for i, (t0, b0) in enumerate(near):
        j = max(j, i + 1)
        while j < len(near) and near[j][0] - t0 < window_s:
            j += 1
        if j < len(near):
            t1, b1 = near[j]
            best = max(best, (b1 - b0) * 8 / (t1 - t0))
    return best


def counters_continuous(samples: list[tuple[float, int]]) -> bool:
    """A qdisc deleted and added again would restart its counters from zero."""
    return all(b1 >= b0 for (_, b0), (_, b1) in zip(samples, samples[1:], strict=False))
