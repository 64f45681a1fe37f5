"""Time dilation: the scenario the host runs for a target scenario slowed k times.

Every clock of the emulated world runs k times slower: link rates (links, overrides, schedule
entries, racks' uplinks, paced background flows) are divided by k; delays, jitter, schedule
offsets, flaps and background on/off periods are multiplied by k; queues keep their bytes (so
their delay in time grows by k, as everything else's). Replayed compute sleeps k x the target's
time (the ranks get k in their RankSpec). Times measured in the dilated world are divided by k
before anything reports or judges them (measure.target_time), so they are the target's.

Byte counts do not change: a dilated run puts exactly the target's bytes on the wire.

`link.tcp` stays in the target's units: the fabric, given k, dilates the kernel's TCP clocks in
every node (fabric.tcp_clocks), and refuses a k whose minimum RTO the kernel's RTO cap cannot
hold (scenario.tcp.rto_bound_problem).
"""

from __future__ import annotations

from typing import Any

from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.tcp import rto_bound_problem
from netsim_ddp.scenario.units import parse_duration, parse_rate

_RATES = ("rate",)
_TIMES = ("delay", "jitter")


def _scale_link(entry: dict[str, Any], k: float, times: tuple[str, ...] = _TIMES) -> None:
    for name in _RATES:
        if entry.get("rate") is not None:
            entry[name] = f"{parse_rate(entry[name]) / k!r}bit"
    for name in times:
        if entry.get(name) is not None:
            entry[name] = f"{parse_duration(entry[name]) * k!r}s"


def dilated(scenario: Scenario, k: float) -> Scenario:
    """The host's scenario for `scenario` at dilation k (k = 1: the scenario itself, with the
    dilation setting cleared). Raises ScenarioError naming the field a dilated value breaks
    (a delay x k beyond what the delay line holds, a rate / k below tbf's least)."""
    if k < 1:
        raise ValueError(f"dilation {k} < 1")
    bound = rto_bound_problem(scenario.link.tcp, k)
    if bound is not None:  # the kernel's TCP clocks cannot follow (see scenario.tcp)
        raise ScenarioError(scenario.path, "emulation.dilation", bound)
    data = scenario.model_dump(mode="json", exclude_none=True)
    data.pop("emulation", None)
    data.pop("sweep", None)
    link = data["link"]
    _scale_link(link, k)
    for override in link.get("override", []):
        _scale_link(override, k)
    for change in link.get("schedule", []):
        _scale_link(change, k, _TIMES + ("at", "down"))
    for flow in data.get("background", []):
        _scale_link(flow, k, ("on", "off", "start"))
    if "uplink" in data["topology"]:
        _scale_link(data["topology"]["uplink"], k)
    try:
        host = Scenario.from_dict(data, scenario.path)
    except ScenarioError as exc:
        raise ScenarioError(scenario.path, f"emulation.dilation ({k:g} x {exc.field})",
                            exc.reason) from None
    return host
