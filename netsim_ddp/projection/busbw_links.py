"""The target's transport, not gloo's: links that deliver the bus bandwidth a user's own
nccl-tests run measured (`[link] busbw_from`), at the job's bucket sizes.

On the emulated links gloo reaches the line rate (measured here at x40: a 4-node ring at 250
Mbit/s delivered 99-100% of TCP's goodput from 256 KiB to 32 MiB), while NCCL's socket transport
on a real 10/25GbE cluster often stays well under it, and that gap sets the exposed
communication of many published results. So the links are given the rate and the latency that
make a ring deliver the file's bus bandwidth at the sizes DDP all-reduces:

- the sizes: DDP's buckets for the job (torch's assignment: parameters in reverse order, the
  first bucket closed at 1 MiB, the others at bucket_size), in every wire dtype the modes send;
- the target: the file's bus bandwidth at each size (`calibrate`'s curve through its points,
  at the file's world size);
- the fit: bus time S / busbw(S) against S as one line a + S / B over those sizes (relative
  error, as `calibrate` fits its alpha-beta line);
- the links: rate = B x the headers per payload byte (so TCP's goodput is B), and a one-way
  delay a / W (a ring of W ranks waits one link delay per step, 2(W-1) steps: a bus time of
  W x delay) where the latency is more than LATENCY_NEGLIGIBLE of the smallest size's time.

Nothing here is trusted on its own: the all-reduce probe times every one of these sizes on
the built links and `fidelity:busbw` compares what it measured with the file (within
TOLERANCE), so a host, a delay line or a fit that does not deliver says so.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import numpy as np

from netsim_ddp.projection.calibrate import (
    CalibrationError,
    alpha_beta_line,
    bus_factor,
    load_allreduce,
)
from netsim_ddp.projection.nccl_tests import NcclParseError
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.target_busbw import (
    FIELD,
    LATENCY_NEGLIGIBLE,
    MAX_STEP,
    TRIM_GOAL,
    TargetBusbw,
    Trim,
    job_sizes,
)
from netsim_ddp.scenario.units import header_factor


def resolve_file(scenario: Scenario) -> Path:
    value = scenario.link.busbw_from
    assert value is not None
    path = Path(value).expanduser()
    if not path.is_absolute() and scenario.path is not None:
        path = scenario.path.parent / path
    if not path.is_file():
        raise ScenarioError(scenario.path, FIELD, f"{value!r}: no such file ({path}); give the "
                            "all_reduce_perf output of nccl-tests run on the target cluster, "
                            "relative to the scenario file")
    return path


def plan_target_busbw(scenario: Scenario) -> TargetBusbw:
    """The links that deliver the file's bus bandwidth at the job's sizes (target units).
    Raises ScenarioError naming the field when the file cannot be used."""
    workload = scenario.workload
    assert workload is not None and scenario.link.busbw_from is not None
    if scenario.topology.nodes < 2 or not scenario.fidelity.enabled:
        raise ScenarioError(scenario.path, FIELD, "the links' bus bandwidth is checked by the "
                            "all-reduce probe between nodes: it needs 2 or more nodes and "
                            "fidelity.enabled = true")
    if any(o.rate is not None for o in scenario.link.override):
        raise ScenarioError(scenario.path, FIELD, "per-node rate overrides and busbw_from both "
                            "set the links' rate; remove one")
    path = resolve_file(scenario)
    try:
        calibration = load_allreduce(path)
    except (CalibrationError, NcclParseError, OSError) as exc:
        raise ScenarioError(scenario.path, FIELD, f"{path}: {exc}") from None
    factor = bus_factor("all_reduce", calibration.world_size)
    sizes, how = job_sizes(workload)
    bus_s = np.array([calibration.curve(size) / factor for size in sizes])  # S / busbw
    busbw = tuple(float(size * 8 / t) for size, t in zip(sizes, bus_s, strict=True))
    if len(sizes) > 1:
        latency, bandwidth = alpha_beta_line(np.array(sizes, dtype=float), bus_s)
    else:
        latency, bandwidth = 0.0, sizes[0] / float(bus_s[0])
    if latency < LATENCY_NEGLIGIBLE * float(bus_s.min()):
        latency, bandwidth = 0.0, float(np.sum(sizes) / bus_s.sum())  # the bytes' mean rate
    world = scenario.topology.nodes * scenario.topology.ranks_per_node
    mtu = scenario.link.mtu
    rate = bandwidth * 8 * header_factor(mtu)
    return TargetBusbw(
        file=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        file_world_size=calibration.world_size, file_hosts=calibration.hosts,
        world_size=world, sizes=tuple(sizes), busbw_bps=busbw, sizes_from=how,
        latency_s=latency, bandwidth_bps=bandwidth * 8, rate_bps=rate,
        delay_s=latency / world if latency else 0.0, line_rate_bps=scenario.link.rate)


def errors(plan: TargetBusbw, measured_bps: dict[int, float]) -> list[float]:
    """measured / file - 1 at each planned size the probe timed (nan where it timed none)."""
    return [measured_bps[size] / busbw - 1 if size in measured_bps else float("nan")
            for size, busbw in zip(plan.sizes, plan.busbw_bps, strict=True)]


def added_latency(plan: TargetBusbw, errs: list[float]) -> float:
    """The bus-time latency a pass's links added (seconds): each size's measured bus time
    less its time at the plan's bandwidth, averaged with weights 1 / time^2 (relative errors:
    the large sizes, whose latency share is small, count little)."""
    sizes = np.array(plan.sizes, dtype=float)
    measured = sizes * 8 / (np.array(plan.busbw_bps) * (1 + np.array(errs)))
    weights = 1 / measured**2
    return float(np.sum((measured - sizes * 8 / plan.bandwidth_bps) * weights) / weights.sum())


def next_delay(plan: TargetBusbw, tried: list[tuple[float, list[float]]]) -> float | None:
    """The next delay to try, from the passes so far ((delay, errors) each), or None when the
    last is within TRIM_GOAL or timed nothing. The latency a delay adds grows faster than the
    delay on a real TCP path, so it is taken as a power of the delay, its exponent from the
    last two passes (1, the ring's own W x delay, while there is one), each step at most
    MAX_STEP x the last delay either way."""
    delay, errs = tried[-1]
    if any(math.isnan(e) for e in errs) or max(abs(e) for e in errs) <= TRIM_GOAL:
        return None
    latency = added_latency(plan, errs)
    if latency <= 0:  # the links added none that shows: more delay
        return delay * MAX_STEP
    power = 1.0
    if len(tried) > 1:
        earlier, earlier_errs = tried[-2]
        before = added_latency(plan, earlier_errs)
        if before > 0 and earlier != delay:
            fitted = math.log(latency / before) / math.log(delay / earlier)
            power = fitted if math.isfinite(fitted) and fitted > 0.2 else power
    step = (plan.latency_s / latency) ** (1 / power)
    return delay * min(max(step, 1 / MAX_STEP), MAX_STEP)


def trimmed(plan: TargetBusbw, tried: list[tuple[float, list[float]]]) -> TargetBusbw:
    """The plan with the delay of the best pass (least worst error), the passes recorded."""
    def worst(errs: list[float]) -> float:
        return max((abs(e) for e in errs), default=math.inf) if not any(
            math.isnan(e) for e in errs) else math.inf
    best = min(tried, key=lambda t: worst(t[1]))[0]
    return dataclasses.replace(plan, delay_s=best, trim=Trim(
        passes=tuple((d, worst(errs)) for d, errs in tried), first_delay_s=plan.delay_s))


def with_target_busbw(scenario: Scenario, plan: TargetBusbw) -> Scenario:
    """The scenario whose links are the plan's (rate, and the delay added to the link's own);
    still in target units (dilation comes after)."""
    data = scenario.model_dump(mode="json", exclude_none=True)
    link = data["link"]
    link.pop("busbw_from")
    link["rate"] = f"{plan.rate_bps!r}bit"
    if plan.delay_s:
        link["delay"] = f"{scenario.link.delay + plan.delay_s!r}s"
    return Scenario.from_dict(data, scenario.path)
