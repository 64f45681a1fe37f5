"""`[link] busbw_from`: the links' delay chosen by probe passes on freshly built links, until
the probe's bus bandwidth meets the file's (projection/busbw_links.py plans each pass)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from netsim_ddp.fabric import Fabric
from netsim_ddp.hostfacts.placement import Placement
from netsim_ddp.projection.busbw_links import (
    errors,
    next_delay,
    trimmed,
    with_target_busbw,
)
from netsim_ddp.run.emulated_site import EmulatedSite
from netsim_ddp.run.probing import probe_collective
from netsim_ddp.run.site import Progress, RunOptions
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.target_busbw import TRIM_PASSES, TargetBusbw
from netsim_ddp.verdicts.busbw_checks import measured_busbw


def trimmed_busbw(scenario: Scenario, workload, plan: TargetBusbw, dilation: float,
                   run_id: str, placement: Placement, out: Path, timeout_s: float | None,
                   progress: Progress) -> TargetBusbw:
    """`[link] busbw_from`'s links, their delay chosen by probe passes (each: the links built,
    the job's sizes timed once, the links taken down; projection.busbw_links.next_delay). A
    plan without latency has nothing to search: its rate alone is the file's bandwidth."""
    if not plan.delay_s:
        return plan
    tried: list[tuple[float, list[float]]] = []
    delay: float | None = plan.delay_s
    while delay is not None and len(tried) < TRIM_PASSES:
        candidate = dataclasses.replace(plan, delay_s=delay)
        planned = with_target_busbw(scenario, candidate)
        host = dilated(planned, dilation) if dilation != 1 else planned
        with Fabric(host, dilation=dilation, run_id=run_id) as fabric:
            site = EmulatedSite(fabric, host, placement, RunOptions(out, progress=progress))
            fidelity = probe_collective(
                site.launch, host.model_copy(update={"workload": workload}),
                out / f"pass{len(tried)}", timeout_s, progress, site.watch(None),
                workload=workload, attempts=1, job_sizes=plan.sizes)
        errs = errors(plan, measured_busbw(plan, fidelity, dilation))
        tried.append((delay, errs))
        progress(f"{scenario.name}: busbw_from pass {len(tried)}: delay {delay * 1e6:.0f} us, "
                 "bus bandwidth " + ", ".join(f"{e:+.1%}" for e in errs) + " of the file's")
        delay = next_delay(plan, tried)
    return trimmed(plan, tried)
