"""One scenario, end to end, as a flow: plan (the workload resolved, its ranks placed, a file's
bus bandwidth trimmed: run/busbw_trim.py), build (the fabric, dilated for a scale model),
probe and train (run/training.py on run/emulated_site.py), measure (times to the target's
clock), judge (verdicts/judge.py), report (the ScenarioReport returned).

The order matters for trust: the all-reduce probe runs before any training, so a network this
host cannot emulate faithfully is refused with a reason instead of producing numbers that
measure the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.background import BackgroundBytes
from netsim_ddp.fabric.naming import new_run_id
from netsim_ddp.hostfacts.placement import place
from netsim_ddp.measure.target_time import to_target_time
from netsim_ddp.projection.busbw_links import plan_target_busbw, with_target_busbw
from netsim_ddp.run.busbw_trim import trimmed_busbw
from netsim_ddp.run.emulated_site import EmulatedSite
from netsim_ddp.run.folders import remove_when_done, run_folder
from netsim_ddp.run.site import Progress, RunOptions
from netsim_ddp.run.training import probe_and_train
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.units import format_rate
from netsim_ddp.verdicts.judge import judge_run
from netsim_ddp.verdicts.run_checks import delay_line_checks
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import ModeResult
from netsim_ddp.workload.launcher.resolve import resolved_workload


def run_scenario(scenario: Scenario, *, out_dir: Path | None = None,
                 iterations: int | None = None, profile: bool = False,
                 allow_untrusted: bool = False, timeout_s: float | None = None,
                 progress: Progress = lambda message: None,
                 on_built: Callable[[Fabric], None] | None = None) -> ScenarioReport:
    """Build the scenario's network, probe it, train every mode on it; everything is removed
    before this returns, whatever happens. `on_built(fabric)` runs once the network exists,
    before anything runs in it (to add your own kernel objects: routes, extra links).

    A scale model ([emulation] dilation = k): the host runs scenario.dilation.dilated(k) and
    every time reported is the target's (measure.target_time). dilation = "auto" tries k = 1, 2,
    4, ... until the run is not untrusted: the probe trusts the links and the host kept time
    (replay, delay line, TCP clocks), at most emulation.max_dilation.

    A run at a fixed k that is untrusted for its emulation's checks (late frames, late replay:
    not a refused probe) is measured once more, as a person would before giving up; the report
    keeps the second and says so (report.retried).

    Without `out_dir` each run writes to a temporary folder, removed once the run passed or was
    untrusted; a run that failed or erred keeps it (report.out_dir) for its logs."""
    kwargs = dict(out_dir=out_dir, iterations=iterations, profile=profile,
                  allow_untrusted=allow_untrusted, timeout_s=timeout_s, progress=progress,
                  on_built=on_built)
    if not scenario.emulation.auto:
        k = float(scenario.emulation.dilation)
        report = _run_at(scenario, k, **kwargs)  # type: ignore[arg-type]
        if report.status == "untrusted" and not report.refused:
            missed = ", ".join(report.untrusted_checks)
            progress(f"{scenario.name}: untrusted ({missed}): measuring again")
            report = _run_at(scenario, k, **kwargs)  # type: ignore[arg-type]
            report.retried = f"measured again: the first run was untrusted ({missed})"
        return report
    untrusted: list[str] = []
    k = 1.0
    while True:
        progress(f"{scenario.name}: dilation auto: trying k = {k:g}")
        report = _run_at(scenario, k, **kwargs)  # type: ignore[arg-type]
        if report.status != "untrusted":
            report.dilation_chosen = (
                f"auto: k = {k:g}, the least power of two this host emulated faithfully"
                + (f" (untrusted: {'; '.join(untrusted)})" if untrusted else ""))
            return report
        # The links (the probe) and the host's keeping time (replay, delay line, TCP clocks)
        # both gain from a larger k: each is a reason to try the next one.
        probe = report.fidelity
        why = [f"probe reached {probe.fraction:.0%} of the link"
               if name == "probe refused" and probe is not None else name
               for name in report.untrusted_checks]
        untrusted.append(f"k = {k:g}: {', '.join(why)}")
        k *= 2
        if k > scenario.emulation.max_dilation:
            report.dilation_chosen = (f"auto: no k up to max_dilation "
                                      f"{scenario.emulation.max_dilation:g} was emulated "
                                      f"faithfully ({'; '.join(untrusted)})")
            return report


def _run_at(scenario: Scenario, dilation: float, *, out_dir: Path | None,
            **kwargs) -> ScenarioReport:
    """One run at one dilation; a temporary folder (no out_dir) is removed unless the run
    failed or erred, whose logs someone will read."""
    report = _run_in_folder(scenario, dilation, out_dir=out_dir, **kwargs)
    if out_dir is None and remove_when_done(report.out_dir, report.status):
        report.out_dir = None
    return report


def _run_in_folder(scenario: Scenario, dilation: float, *, out_dir: Path | None,
                   iterations: int | None, profile: bool, allow_untrusted: bool,
                   timeout_s: float | None, progress: Progress,
                   on_built: Callable[[Fabric], None] | None) -> ScenarioReport:
    workload = resolved_workload(scenario, iterations)
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
        target_busbw = trimmed_busbw(scenario, workload, target_busbw, dilation, run_id,
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
                         timeout_s, progress, on_built)
    finally:  # the delay line's counters are final once the fabric is gone
        report.delay_line_stats = fabric.delay_line_stats
    report.checks.extend(delay_line_checks(fabric.delay_lines, fabric.delay_line_stats,
                                           trained[0] if trained else {}, multi_node=
                                           scenario.topology.nodes > 1))
    if trained is None:
        return report
    results, background = trained
    judge_run(report, {mode: to_target_time(result, dilation)
                       for mode, result in results.items()}, background)
    return report


def _train(fabric: Fabric, scenario: Scenario, workload, report: ScenarioReport, out: Path,
           profile: bool, allow_untrusted: bool, timeout_s: float | None,
           progress: Progress, on_built: Callable[[Fabric], None] | None = None,
           ) -> tuple[dict[str, ModeResult], BackgroundBytes] | None:
    """Inside the built fabric: the probe, then every mode. None if the probe refused."""
    with fabric:
        report.run_id = fabric.run_id
        report.delay_backends = fabric.delay_backends
        report.tcp_settings = fabric.tcp_settings
        if on_built is not None:
            on_built(fabric)
        assert report.placement is not None  # placed before anything was built
        site = EmulatedSite(fabric, scenario, report.placement, RunOptions(
            out, profile=profile, allow_untrusted=allow_untrusted, timeout_s=timeout_s,
            progress=progress))
        with site.sampled_counters(report):
            return probe_and_train(scenario.model_copy(update={"workload": workload}), site,
                                   report)
