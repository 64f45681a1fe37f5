"""One scenario, end to end: build its network, check the host can drive it, train every mode
on it, and account for what each mode put on the wire.

The order matters for trust: the all-reduce probe runs before any training, so a network this
host cannot emulate faithfully is refused with a reason instead of producing numbers that
measure the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from netsim_ddp.common.metrics import ring_allreduce_lower_bound
from netsim_ddp.common.signal_files import SIGNAL_DIR_ENV
from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.background import BackgroundBytes, BackgroundTraffic
from netsim_ddp.fabric.counters.connection_sampler import ConnectionSampler
from netsim_ddp.fabric.counters.sampling_thread import SamplingThread
from netsim_ddp.fabric.counters.uplink_sampler import UplinkSampler
from netsim_ddp.fabric.delayline import health as delay_line_health
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.fabric.naming import new_run_id
from netsim_ddp.fabric.schedule import LinkScheduler, plan_schedule
from netsim_ddp.hostfacts.hostload import CpuLoad, CpuTimes
from netsim_ddp.hostfacts.nccl import (
    NODE_IFNAME,
    rank_log_lines,
    rank_nodes_from_logs,
    verify_transport,
)
from netsim_ddp.hostfacts.placement import place
from netsim_ddp.measure.attribution import CounterSeries
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.measure.target_time import to_target_time
from netsim_ddp.measure.wire import check_background_followed, window_bytes
from netsim_ddp.projection.busbw_links import (
    errors,
    next_delay,
    plan_target_busbw,
    trimmed,
    with_target_busbw,
)
from netsim_ddp.run.probing import ProbeAttempts, ProbeGate, ProbeRefused, probe_collective
from netsim_ddp.run.site import Progress, RunOptions, Site
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.target_busbw import TRIM_PASSES, TargetBusbw
from netsim_ddp.scenario.units import format_rate
from netsim_ddp.verdicts.busbw_checks import busbw_check, measured_busbw
from netsim_ddp.verdicts.gate import Verdict, default_expectations, evaluate
from netsim_ddp.verdicts.run_checks import (
    background_checks,
    crossing_checks,
    delay_line_checks,
    measurement_checks,
    replay_checks,
    wire_ratio_checks,
)
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.verdicts.schedule_checks import attach_link_states, schedule_checks
from netsim_ddp.verdicts.script_checks import framework_checks
from netsim_ddp.verdicts.tcp_checks import tcp_checks
from netsim_ddp.workload import ModeResult, RankSpec, WorkloadError, launch
from netsim_ddp.workload.contract.noise_draws import NoiseModel, resolved_trace
from netsim_ddp.workload.contract.window import NODE_ENV
from netsim_ddp.workload.launcher.script_launch import launch_script, resolve_command


def run_scenario(scenario: Scenario, *, out_dir: Path | None = None,
                 iterations: int | None = None, profile: bool = False,
                 allow_untrusted: bool = False, timeout_s: float | None = None,
                 progress: Progress = lambda message: None,
                 on_built: Callable[[Fabric], None] | None = None) -> ScenarioReport:
    """Build the scenario's network, probe it, train every mode on it; everything is removed
    before this returns, whatever happens. `on_built(fabric)` runs once the network exists,
    before anything runs in it (to add your own kernel objects: routes, extra links).

    A scale model ([emulation] dilation = k): the host runs scenario.dilation.dilated(k) and
    every time reported is the target's (measure.dilation). dilation = "auto" tries k = 1, 2,
    4, ... until the fidelity probe trusts the host (at most emulation.max_dilation).

    Without `out_dir` each run writes to a temporary folder, removed once the run passed or was
    refused; a run that failed or erred keeps it (report.out_dir) for its logs."""
    kwargs = dict(out_dir=out_dir, iterations=iterations, profile=profile,
                  allow_untrusted=allow_untrusted, timeout_s=timeout_s, progress=progress,
                  on_built=on_built)
    if not scenario.emulation.auto:
        return _run_at(scenario, float(scenario.emulation.dilation), **kwargs)  # type: ignore[arg-type]
    refused: list[str] = []
    k = 1.0
    while True:
        progress(f"{scenario.name}: dilation auto: trying k = {k:g}")
        report = _run_at(scenario, k, **kwargs)  # type: ignore[arg-type]
        probe = report.fidelity
        untrusted = report.refused is not None and probe is not None and not probe.trusted
        if not untrusted or probe is None:
            report.dilation_chosen = (
                f"auto: k = {k:g}, the least power of two whose fidelity probe was trusted"
                + (f" (refused: {'; '.join(refused)})" if refused else ""))
            return report
        refused.append(f"k = {k:g}: probe reached {probe.fraction:.0%} of the link")
        k *= 2
        if k > scenario.emulation.max_dilation:
            report.dilation_chosen = (f"auto: no k up to max_dilation "
                                      f"{scenario.emulation.max_dilation:g} was trusted "
                                      f"({'; '.join(refused)})")
            return report


def _run_at(scenario: Scenario, dilation: float, *, out_dir: Path | None,
            **kwargs) -> ScenarioReport:
    """One run at one dilation; a temporary folder (no out_dir) is removed unless the run
    failed or erred, whose logs someone will read."""
    report = _run_in_folder(scenario, dilation, out_dir=out_dir, **kwargs)
    if out_dir is None and remove_when_done(report.out_dir, report.status):
        report.out_dir = None
    return report


def remove_when_done(temporary: Path | None, status: str) -> bool:
    """Remove a run's temporary folder (none given: nothing) once nobody will read it: the run
    passed or was refused, or the folder is empty. A failed or erred run keeps its logs. True
    if removed."""
    if temporary is None or not temporary.is_dir():
        return False
    if status not in ("passed", "refused") and any(temporary.iterdir()):
        return False
    shutil.rmtree(temporary, ignore_errors=True)
    return True


def _run_in_folder(scenario: Scenario, dilation: float, *, out_dir: Path | None,
                   iterations: int | None, profile: bool, allow_untrusted: bool,
                   timeout_s: float | None, progress: Progress,
                   on_built: Callable[[Fabric], None] | None) -> ScenarioReport:
    workload = scenario.workload
    if workload is None:
        raise ValueError(f"{scenario.path or scenario.name}: workload: required to run training; "
                         "add a [workload] section (see README)")
    if iterations is not None:
        workload = workload.model_copy(update={"iterations": iterations})
    if workload.command is not None:  # a missing script fails before anything is built
        resolve_command(workload.command, scenario.path.parent if scenario.path else None)
    workload = _resolved_profile(scenario, workload)
    target_busbw = None
    if scenario.link.busbw_from is not None:  # the target's transport: links that deliver it
        target_busbw = plan_target_busbw(scenario.model_copy(update={"workload": workload}))
    placement = place(workload, scenario.topology)
    if placement.refused:  # before any network is built: this host cannot run it
        return ScenarioReport(scenario, placement=placement, refused=placement.refused)
    workload = workload.model_copy(update={"backend": placement.backend})
    run_id = new_run_id()
    out = run_folder(Path(out_dir) if out_dir else None, run_id)
    if target_busbw is not None:
        progress(f"{scenario.name}: {target_busbw.summary}; probing for the delay")
        target_busbw = _trimmed_busbw(scenario, workload, target_busbw, dilation, run_id,
                                      placement, out / "busbw-trim", timeout_s, progress)
        scenario = with_target_busbw(scenario, target_busbw)
    host = dilated(scenario, dilation) if dilation != 1 else scenario
    fabric = Fabric(host, dilation=dilation, run_id=run_id)
    report = ScenarioReport(scenario, out_dir=out, placement=placement,
                            host_scenario=host if dilation != 1 else None, dilation=dilation,
                            target_busbw=target_busbw)
    progress(f"{scenario.name}: building {scenario.topology.nodes} nodes"
             + (f" (time-dilated x{dilation:g}: links at {format_rate(host.link.rate)})"
                if dilation != 1 else ""))
    try:
        trained = _train(fabric, host, workload, report, out, profile, allow_untrusted,
                         timeout_s, progress, on_built, dilation)
    finally:  # the delay line's counters are final once the fabric is gone
        report.delay_line_stats = fabric.delay_line_stats
    report.checks.extend(delay_line_checks(fabric.delay_lines, fabric.delay_line_stats,
                                           trained[0] if trained else {}, multi_node=
                                           scenario.topology.nodes > 1))
    if trained is None:
        return report
    results, background = trained
    finish_report(report, {mode: to_target_time(result, dilation)
                           for mode, result in results.items()}, background)
    return report


def _trimmed_busbw(scenario: Scenario, workload, plan: TargetBusbw, dilation: float,
                   run_id: str, placement, out: Path, timeout_s: float | None,
                   progress: Progress) -> TargetBusbw:
    """`[link] busbw_from`'s links, their delay chosen by probe passes (each: the links built,
    the job's sizes timed once, the links taken down; projection.target_busbw.next_delay). A
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
            site = EmulatedSite(fabric, host, placement.node_env(
                run_id, [node.name for node in fabric.nodes]), RunOptions(out, progress=progress))
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


def _resolved_profile(scenario: Scenario, workload):
    """workload.profile (and the noise's trace) relative to the scenario file, as absolute
    paths the ranks read."""
    base = scenario.path.parent if scenario.path is not None else Path.cwd()
    if workload.noise is not None and workload.noise.trace is not None:
        workload = workload.model_copy(update={"noise": resolved_trace(workload.noise, base)})
    if workload.profile is None or Path(workload.profile).is_absolute():
        return workload
    return workload.model_copy(update={"profile": str((base / workload.profile).resolve())})


def finish_report(report: ScenarioReport, results: dict[str, ModeResult],
                  background: BackgroundBytes) -> None:
    """Wire accounting, then every check and verdict: one code path for every launcher."""
    scenario = report.scenario
    link_bps, _ = slowest_link_goodput(scenario)
    for mode, result in results.items():
        total, bg = window_bytes(result, background)
        check_background_followed(result, background)
        report.modes[mode] = ModeReport(result, (total - bg) / result.iterations,
                                        bg / result.iterations, link_bps,
                                        node_names=scenario.topology.node_names,
                                        ranks_per_node=scenario.topology.ranks_per_node,
                                        noise=_noise_model(scenario), counters=report.counters)
    script = scenario.workload is not None and scenario.workload.is_script
    host = report.host_scenario or scenario  # what ran on the host's clock
    report.checks.extend(measurement_checks(report.modes, scenario.topology.nodes))
    report.checks.extend(replay_checks(report))
    report.checks.extend(framework_checks(report))  # a script's device-dependent paths
    report.checks.extend(tcp_checks(report))
    report.checks.extend(background_checks(host.background, background, results))
    if not script:  # a script's variants are names: no mode's wire dtype or all-reduce to hold
        report.checks.extend(wire_ratio_checks(report.modes))  # them to (see docs/scripts.md)
        report.checks.extend(crossing_checks(scenario, report.modes))
    if report.link_schedule is not None:
        attach_link_states(report.modes, report.link_schedule)
        report.checks.extend(schedule_checks(scenario, report.modes, report.link_schedule,
                                             report.host_scenario))
    # The default claim is about the network: a single node's ranks never touch it.
    expectations = (scenario.expect if scenario.expect is not None
                    else default_expectations(list(report.modes))
                    if scenario.topology.nodes > 1 and not script else [])
    report.checks.extend(evaluate(expectation, report.modes) for expectation in expectations)


def _noise_model(scenario: Scenario) -> NoiseModel | None:
    """The replay's seeded noise, for naming its stalls in the tail (no trace needed)."""
    workload = scenario.workload
    return NoiseModel(workload.noise) if workload is not None and workload.noise else None


def run_folder(base: Path | None, run_id: str) -> Path:
    """A folder only this run writes: `base/run-<run id>`, made fresh, with `base/latest`
    pointing at it (a temporary folder without `base`). A folder shared with an earlier run
    would replay its signals to the background flows and lend it its result and error files."""
    if base is None:
        return Path(tempfile.mkdtemp(prefix=f"netsim-ddp-run-{run_id}-"))
    base.mkdir(parents=True, exist_ok=True)
    out = base / f"run-{run_id}"
    out.mkdir()  # FileExistsError rather than share one
    latest = base / f".latest-{run_id}"
    latest.symlink_to(out.name)
    latest.replace(base / "latest")  # atomic: parallel runs never see it half-made
    return out


def _train(fabric: Fabric, scenario: Scenario, workload, report: ScenarioReport, out: Path,
           profile: bool, allow_untrusted: bool, timeout_s: float | None,
           progress: Progress, on_built: Callable[[Fabric], None] | None = None,
           dilation: float = 1.0,
           ) -> tuple[dict[str, ModeResult], BackgroundBytes] | None:
    """Inside the built fabric: the probe, then every mode. None if the probe refused."""
    with fabric:
        report.run_id = fabric.run_id
        report.delay_backends = fabric.delay_backends
        report.tcp_settings = fabric.tcp_settings
        if on_built is not None:
            on_built(fabric)
        placement = report.placement or place(workload, scenario.topology)
        site = EmulatedSite(fabric, scenario, placement.node_env(
            fabric.run_id, [node.name for node in fabric.nodes]), RunOptions(
                out, profile=profile, allow_untrusted=allow_untrusted, timeout_s=timeout_s,
                progress=progress))
        assert fabric.plan is not None  # built
        uplinks = UplinkSampler(fabric.plan)  # racks only: a flat switch has no uplinks
        # Per connection, where a neighbour's flows share the nodes' counters with the job.
        connections = [ConnectionSampler(fabric.plan)] if scenario.background else []
        samplers: list[SamplingThread] = [uplinks, *connections]
        try:
            with contextlib.ExitStack() as sampling:
                for sampler in samplers:
                    sampling.enter_context(sampler)
                return probe_and_train(scenario.model_copy(update={"workload": workload}),
                                       site, report)
        finally:  # read while the switch exists
            report.uplinks = fabric.uplink_counters()
            report.counters = [CounterSeries(f"uplink {name} drops", None, points)
                               for name, points in uplinks.samples.items() if points]
            for sampler in connections:
                report.counters += [CounterSeries(name, None, points)
                                    for name, points in sorted(sampler.grown().items())]
            for sampler in samplers:
                if sampler.error:
                    progress(f"{scenario.name}: {sampler.thread_name} sampled until: "
                             f"{sampler.error}")


class EmulatedSite(Site):
    """The nodes live in the fabric's namespaces on this host: torchrun in each, background
    flows between them, [[link.schedule]] on their links, the probe gated in the training
    launch."""

    gated_probe = True

    def __init__(self, fabric: Fabric, scenario: Scenario, node_env: list[dict[str, str]],
                 options: RunOptions):
        super().__init__(options)
        self.fabric, self.scenario, self.node_env = fabric, scenario, node_env

    def launch(self, spec: RankSpec, out_dir: Path, timeout_s: float, *, profile: bool = False,
               env: Mapping[str, str] | None = None,
               watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]:
        scenario, fabric = self.scenario, self.fabric
        if spec.workload.is_script and spec.selected_modes():
            return launch_script(
                fabric.nodes, spec.workload, out_dir, timeout_s,
                ranks_per_node=scenario.topology.ranks_per_node,
                base_dir=scenario.path.parent if scenario.path else None, env=env,
                watchdog=watchdog, node_env=self.node_env, runs=spec.selected_modes(),
                dilation=spec.dilation)
        return launch(fabric.nodes, spec, out_dir, timeout_s,
                      ranks_per_node=scenario.topology.ranks_per_node, profile=profile,
                      env=env, watchdog=watchdog, node_env=self.node_env)

    def traffic(self, signals: Path) -> BackgroundTraffic:
        return BackgroundTraffic(self.fabric, self.scenario.background, signals=signals)

    def watch(self, traffic: BackgroundTraffic | None) -> Callable[[], None] | None:
        return watchdog(self.fabric, traffic)

    def scheduler(self, schedule, signals: Path) -> LinkScheduler | None:
        plan = self.fabric.plan
        assert plan is not None  # the fabric is built while the site is used
        return LinkScheduler(plan.nodes, plan.switch_netns, schedule, signals)


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
    link_bps, _ = slowest_link_goodput(scenario)
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
    timeout_s = timeout_s or (_training_timeout(scenario, workload, link_bps, dilation)
                              + (probing.limit * probing.attempt_timeout_s if probing else 0))
    if workload.is_script:
        progress(f"{scenario.name}: each run of the script may take {timeout_s:.0f} s (--timeout)")
    schedule = plan_schedule(scenario)
    report.link_schedule = site.scheduler(schedule, signals) if schedule else None
    if schedule and report.link_schedule is None:
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
    report.checks.append(Verdict("fidelity", fidelity.trusted, at + fidelity.reason))
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


def watchdog(fabric: Fabric, traffic: BackgroundTraffic | None = None) -> Callable[[], None]:
    """What launch calls while the ranks run: a forwarder or background flow that died ends
    the run at once with its reason (not a gloo timeout minutes later), and the forwarders
    report their counters every SNAPSHOT_EVERY_S, for the per-mode checks."""
    last_snapshot = [time.monotonic()]

    def check() -> None:
        fabric.check_delay_lines()
        if traffic is not None:
            traffic.check()
        if time.monotonic() - last_snapshot[0] >= delay_line_health.SNAPSHOT_EVERY_S:
            last_snapshot[0] = time.monotonic()
            for monitor in fabric.delay_lines.values():
                monitor.request_snapshot()

    return check


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


def _training_timeout(scenario: Scenario, workload, link_bps: float,
                      dilation: float = 1.0) -> float:
    """Generous: start-up, plus every step at 10x the ideal all-reduce time (and 2 s), plus
    replayed compute (x the dilation; a profile's time unknown here: 2 s)."""
    world = scenario.topology.nodes * scenario.topology.ranks_per_node
    step = max(2.0, 10 * ring_allreduce_lower_bound(workload.params * 4, world, link_bps))
    if workload.is_script:  # per variant: its start-up (imports, model, data), then steps
        return 240 + (workload.warmup + workload.iterations) * 5 * step
    if workload.replayed:
        step += 2 * dilation * ((workload.compute or 2.0) + workload.optimizer)
    steps = len(workload.modes) * (workload.warmup + workload.iterations) * 2
    return 120 + steps * step * workload.grad_accumulation
