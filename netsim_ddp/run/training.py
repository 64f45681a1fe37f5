"""On a site's nodes: the all-reduce probe, then every mode trained, the same code for every
site (this host's fabric, real hosts, several machines). The probe comes first so a network this
host cannot emulate faithfully is refused with a reason instead of measuring the CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from netsim_ddp.common.metrics import ring_allreduce_lower_bound
from netsim_ddp.common.signal_files import SIGNAL_DIR_ENV
from netsim_ddp.fabric.background import BackgroundBytes
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.hostfacts.hostload import CpuLoad, CpuTimes
from netsim_ddp.hostfacts.nccl import (
    NODE_IFNAME,
    rank_log_lines,
    rank_nodes_from_logs,
    verify_transport,
)
from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.run.probing import ProbeAttempts, ProbeGate, ProbeRefused, probe_collective
from netsim_ddp.run.site import Site
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.verdicts.busbw_checks import busbw_check
from netsim_ddp.verdicts.gate import host_verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import ModeResult, RankSpec, WorkloadError
from netsim_ddp.workload.contract.window import NODE_ENV


def probe_and_train(scenario: Scenario, site: Site, report: ScenarioReport,
                    ) -> tuple[dict[str, ModeResult], BackgroundBytes] | None:
    """The probe, then every mode, on `site`'s nodes. None if the probe refused.

    `scenario`: what the site's hosts run (a scale model's dilated one), its workload resolved
    (iterations, backend, profile path); the run's folder and options are the site's, its
    dilation the report's."""
    workload = scenario.workload
    assert workload is not None  # only a training scenario is trained
    options = site.options
    out, progress, allow_untrusted = options.out, options.progress, options.allow_untrusted
    profile, timeout_s, dilation = options.profile, options.timeout_s, report.dilation
    transport_ifname = site.transport_ifname
    job_sizes = report.target_busbw.sizes if report.target_busbw is not None else ()
    nccl = workload.backend == "nccl" and scenario.topology.nodes > 1
    probing: ProbeAttempts | None = None
    # Under NCCL the probe also runs without fidelity: its log shows NCCL's transport between
    # nodes, which must be verified before anything is measured.
    if (scenario.fidelity.enabled or nccl) and scenario.topology.nodes > 1:
        progress(f"{scenario.name}: all-reduce probe (can this host drive the links?)")
        # A script's launches are its own: the probe gets a launch of its own before them.
        if site.gated_probe and not nccl and not workload.is_script:
            probing = ProbeAttempts(scenario, workload, job_sizes=job_sizes)
        else:
            fidelity = probe_collective(site.launch, scenario, out / "probe", timeout_s,
                                        progress, site.watch(None), workload=workload,
                                        attempts=None if scenario.fidelity.enabled else 1,
                                        job_sizes=job_sizes)
            if nccl and not _transport_verified(report, scenario, out / "probe" / "attempt0",
                                                transport_ifname):
                return None
            if scenario.fidelity.enabled and not _fidelity_judged(report, fidelity,
                                                                  allow_untrusted):
                return None
    training = (f"{scenario.name}: training {', '.join(workload.modes)} ({workload.warmup} "
                f"warm-up + {workload.iterations} measured "
                f"{'steps of the script' if workload.is_script else 'iterations'} each)")
    before = CpuTimes.read()

    def on_train() -> None:  # the gated probe's verdict: train
        nonlocal before
        assert probing is not None
        _fidelity_judged(report, probing.fidelity, allow_untrusted)
        before = CpuTimes.read()
        progress(training)

    if probing is None:
        progress(training)
    signals = out / "signals"
    signals.mkdir(parents=True)  # this run's own: an older run's files would replay
    spec = RankSpec(workload=workload, allreduce_probe=probing.probe if probing else None,
                    probe_gated=probing is not None, dilation=dilation)
    timeout_s = timeout_s or (_training_timeout(scenario, workload, dilation)
                              + (probing.limit * probing.attempt_timeout_s if probing else 0))
    if workload.is_script:
        progress(f"{scenario.name}: each run of the script may take {timeout_s:.0f} s (--timeout)")
    report.link_schedule = site.scheduler(signals)
    if scenario.link.schedule and report.link_schedule is None:
        raise WorkloadError(f"{scenario.name}: [[link.schedule]] is not supported by this "
                            "launcher; remove it or run the scenario with `netsim-ddp run`")
    try:
        with site.traffic(signals) as flows, report.link_schedule or contextlib.nullcontext():
            gate = (ProbeGate(probing, out / "train", allow_untrusted, progress, on_train)
                    if probing else None)
            results = site.launch(spec, out / "train", timeout_s, profile=profile,
                               env={NODE_ENV: "1", SIGNAL_DIR_ENV: str(signals)},
                               watchdog=_chained(gate, site.watch(flows)))
            report.host_load = CpuLoad.between(before, CpuTimes.read())
            background = flows.stop()
    except ProbeRefused:
        assert probing is not None
        _fidelity_judged(report, probing.fidelity, allow_untrusted)
        report.link_schedule = None  # no mode ran: nothing was scheduled
        return None
    if nccl and not _transport_verified(report, scenario, out / "train", transport_ifname):
        return None
    return results, background


def _fidelity_judged(report: ScenarioReport, fidelity: CollectiveFidelity,
                     allow_untrusted: bool) -> bool:
    """Record the probe's verdict; False (the run refused) if the host cannot drive the links
    and the run may not go on untrusted."""
    report.fidelity = fidelity
    at = (f"at dilation x{report.dilation:g} (links at 1/{report.dilation:g} of the target's "
          "rate): " if report.dilation != 1 else "")
    report.checks.append(host_verdict("fidelity", fidelity.trusted, at + fidelity.reason))
    if report.target_busbw is not None:
        report.checks.append(busbw_check(report.target_busbw, fidelity, report.dilation))
    if not fidelity.trusted and not allow_untrusted:
        report.refused = at + fidelity.reason
        return False
    return True


def _chained(*checks: Callable[[], None] | None) -> Callable[[], None] | None:
    """One watchdog that calls each given one in turn (None if there are none)."""
    present = [check for check in checks if check is not None]
    if not present:
        return None

    def check_all() -> None:
        for check in present:
            check()

    return check_all


def _transport_verified(report: ScenarioReport, scenario: Scenario, launch_out: Path,
                        ifname: str = NODE_IFNAME) -> bool:
    """NCCL's log of one launch: did it join the nodes via NET/Socket on eth0 (on a real host,
    its --nic)? If not, the run is refused with the lines that show what it did instead."""
    logs = launch_out / "logs"
    report.transport = verify_transport(
        rank_log_lines(logs), scenario.topology.nodes, scenario.topology.ranks_per_node,
        ifname, rank_nodes=rank_nodes_from_logs(logs, scenario.topology.node_names,
                                                scenario.topology.ranks_per_node))
    if not report.transport.ok:
        report.refused = ("NCCL did not use the emulated network between nodes, so its numbers "
                          f"would not measure it: {report.transport.summary()} (rank logs in "
                          f"{launch_out / 'logs'})")
    return report.transport.ok


def _training_timeout(scenario: Scenario, workload,
                      dilation: float = 1.0) -> float:
    """Generous: start-up, plus every step at 10x the ideal all-reduce time (and 2 s), plus
    replayed compute (x the dilation; a profile's time unknown here: 2 s)."""
    world = scenario.topology.nodes * scenario.topology.ranks_per_node
    link_bps, _ = slowest_link_goodput(scenario)
    step = max(2.0, 10 * ring_allreduce_lower_bound(workload.params * 4, world, link_bps))
    if workload.is_script:  # per variant: its start-up (imports, model, data), then steps
        return 240 + (workload.warmup + workload.iterations) * 5 * step
    if workload.replayed:
        step += 2 * dilation * ((workload.compute or 2.0) + workload.optimizer)
    steps = len(workload.modes) * (workload.warmup + workload.iterations) * 2
    return 120 + steps * step * workload.grad_accumulation
