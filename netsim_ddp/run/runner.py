"""One scenario, end to end: build its network, check the host can drive it, train every mode
on it, and account for what each mode put on the wire.

The order matters for trust: the all-reduce probe runs before any training, so a network this
host cannot emulate faithfully is refused with a reason instead of producing numbers that
measure the CPU.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from netsim_ddp.common.metrics import ring_allreduce_lower_bound, summarize
from netsim_ddp.common.signals import SIGNAL_DIR_ENV
from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.background import BackgroundBytes, BackgroundTraffic, scheduled_on_s
from netsim_ddp.fabric.delayline import health as delay_line_health
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.fabric.schedule import LinkScheduler, plan_schedule
from netsim_ddp.measure.dilation import replay_late_s, to_target_time
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.precision.modes import (
    MODES,
    REFERENCE_MODE,
    get_mode,
    wire_ratio,
)
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.units import format_rate
from netsim_ddp.verdicts.crossing import CrossingVerdict, expected_cross_node
from netsim_ddp.verdicts.gate import Verdict, default_expectations, evaluate
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.verdicts.schedule_checks import attach_link_states, schedule_checks
from netsim_ddp.workload import ModeResult, RankSpec, WorkloadError, launch
from netsim_ddp.workload.collective import (
    AGAIN,
    TRAIN,
    AllreduceProbe,
    attempt_dir,
    busbw_samples,
    give_verdict,
    read_probe,
)
from netsim_ddp.workload.collective import RESULT_FILE as PROBE_RESULT_FILE
from netsim_ddp.workload.compute_noise import NoiseModel, resolved_trace
from netsim_ddp.workload.hostload import CpuLoad, CpuTimes
from netsim_ddp.workload.nccl import (
    NODE_IFNAME,
    rank_log_lines,
    rank_nodes_from_logs,
    verify_transport,
)
from netsim_ddp.workload.placement import place
from netsim_ddp.workload.script_launch import launch_script, resolve_command
from netsim_ddp.workload.window import NODE_ENV

PROBE_MIN_BYTES = 8 * 2**20
PROBE_MAX_BYTES = 64 * 2**20
WIRE_RATIO_TOLERANCE = 0.03  # of the ratio: DDP's own few bytes outside the buckets

Progress = Callable[[str], None]


class Launcher(Protocol):
    """How a run's ranks are started: on the emulated nodes of a fabric (`run`), or one
    torchrun per real host (`netsim-ddp host`). Each rank reads its own NIC's counters at the
    measured window's edges, so the accounting is the same either way."""

    def __call__(self, spec: RankSpec, out_dir: Path, timeout_s: float, *,
                 profile: bool = False,
                 env: Mapping[str, str] | None = None,
                 watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]: ...


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
    4, ... until the fidelity probe trusts the host (at most emulation.max_dilation)."""
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
    host = dilated(scenario, dilation) if dilation != 1 else scenario
    placement = place(workload, scenario.topology)
    if placement.refused:  # before any network is built: this host cannot run it
        return ScenarioReport(scenario, placement=placement, refused=placement.refused)
    workload = workload.model_copy(update={"backend": placement.backend})
    fabric = Fabric(host)
    out = run_folder(Path(out_dir) if out_dir else None, fabric.run_id)
    report = ScenarioReport(scenario, out_dir=out, placement=placement,
                            host_scenario=host if dilation != 1 else None, dilation=dilation)
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


def _resolved_profile(scenario: Scenario, workload):
    """workload.profile (and the noise's trace) relative to the scenario file, as absolute
    paths the ranks read."""
    base = scenario.path.parent if scenario.path is not None else Path.cwd()
    if workload.noise is not None and workload.noise.trace is not None:
        workload = workload.model_copy(update={"noise": resolved_trace(workload.noise, base)})
    if workload.profile is None or Path(workload.profile).is_absolute():
        return workload
    return workload.model_copy(update={"profile": str((base / workload.profile).resolve())})


REPLAY_LATE_FRACTION = 0.05  # of the replayed compute: how late a release may be, at most
REPLAY_LATE_FLOOR_S = 0.002  # ... and never less than this (target time)


def replay_checks(report: ScenarioReport) -> list[Verdict]:
    """Did the host keep each mode's replay schedule? The median over iterations of the latest
    release of any rank (target time) must be within REPLAY_LATE_FRACTION of the replayed
    compute (REPLAY_LATE_FLOOR_S at least); a host that cannot keep it measures itself."""
    workload = report.scenario.workload
    checks = []
    for name, mode in report.modes.items():
        late = replay_late_s(mode.result)
        if late is None or workload is None or mode.compute is None:
            continue  # not replayed (a user's script never is: it has no compute-only steps)
        compute = mode.compute.median
        bound = max(REPLAY_LATE_FRACTION * compute, REPLAY_LATE_FLOOR_S)
        median = statistics.median(late)
        advice = ("" if median <= bound else
                  ": the host could not keep the schedule; raise emulation.dilation")
        checks.append(Verdict(
            f"fidelity:replay:{name}", median <= bound,
            f"{name}: the host released gradients a median {median * 1e3:.2f} ms (max "
            f"{max(late) * 1e3:.2f} ms) later than the replay asked, target time; allowed "
            f"{bound * 1e3:.2f} ms ({REPLAY_LATE_FRACTION:.0%} of {compute * 1e3:.0f} ms "
            f"compute){advice}"))
    return checks


def finish_report(report: ScenarioReport, results: dict[str, ModeResult],
                  background: BackgroundBytes) -> None:
    """Wire accounting, then every check and verdict: one code path for every launcher."""
    scenario = report.scenario
    link_bps, _ = slowest_link_goodput(scenario)
    for mode, result in results.items():
        total, bg = _window_bytes(result, background)
        _check_background_followed(result, background)
        report.modes[mode] = ModeReport(result, (total - bg) / result.iterations,
                                        bg / result.iterations, link_bps,
                                        node_names=scenario.topology.node_names,
                                        ranks_per_node=scenario.topology.ranks_per_node,
                                        noise=_noise_model(scenario))
    script = scenario.workload is not None and scenario.workload.is_script
    host = report.host_scenario or scenario  # what ran on the host's clock
    report.checks.extend(measurement_checks(report.modes, scenario.topology.nodes))
    report.checks.extend(replay_checks(report))
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
        if on_built is not None:
            on_built(fabric)
        placement = report.placement or place(workload, scenario.topology)
        node_env = placement.node_env(fabric.run_id, [node.name for node in fabric.nodes])

        def on_fabric(spec: RankSpec, out_dir: Path, timeout_s: float, *, profile: bool = False,
                      env: Mapping[str, str] | None = None,
                      watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]:
            if spec.workload.is_script and spec.selected_modes():
                return launch_script(
                    fabric.nodes, spec.workload, out_dir, timeout_s,
                    ranks_per_node=scenario.topology.ranks_per_node,
                    base_dir=scenario.path.parent if scenario.path else None, env=env,
                    watchdog=watchdog, node_env=node_env, runs=spec.selected_modes())
            return launch(fabric.nodes, spec, out_dir, timeout_s,
                          ranks_per_node=scenario.topology.ranks_per_node, profile=profile,
                          env=env, watchdog=watchdog, node_env=node_env)

        plan = fabric.plan
        assert plan is not None  # the fabric is built inside this block
        return probe_and_train(
            scenario, workload, report, out, on_fabric, profile=profile,
            allow_untrusted=allow_untrusted, timeout_s=timeout_s, progress=progress,
            traffic=lambda signals: BackgroundTraffic(fabric, scenario.background,
                                                      signals=signals),
            watch=lambda traffic: watchdog(fabric, traffic),
            scheduler=lambda schedule, signals: LinkScheduler(plan.nodes, plan.switch_netns,
                                                              schedule, signals),
            gated_probe=True, dilation=dilation)


class _NoTraffic(contextlib.AbstractContextManager):
    def __exit__(self, *_exc) -> None:
        return None

    def stop(self) -> BackgroundBytes:
        return BackgroundBytes()

    def check(self) -> None:
        return None


def probe_and_train(scenario: Scenario, workload, report: ScenarioReport, out: Path,
                    launcher: Launcher, *, profile: bool, allow_untrusted: bool,
                    timeout_s: float | None, progress: Progress,
                    traffic: Callable[[Path], Any] = lambda signals: _NoTraffic(),
                    watch: Callable[[Any], Callable[[], None] | None] = lambda traffic: None,
                    scheduler: Callable[[Any, Path], LinkScheduler] | None = None,
                    gated_probe: bool = False, transport_ifname: str = NODE_IFNAME,
                    dilation: float = 1.0,
                    ) -> tuple[dict[str, ModeResult], BackgroundBytes] | None:
    """The probe, then every mode, through `launcher`. None if the probe refused.

    `traffic` starts the background flows, `watch` turns them (None while probing) into the
    launch's watchdog, `scheduler` applies [[link.schedule]] (None: the launcher cannot).
    `gated_probe`: the launcher's ranks may run the probe and wait for its verdict in the
    training launch itself (_ProbeGate); else the probe gets launches of its own.
    `transport_ifname`: the NIC(s) NCCL must use between nodes (comma-separated)."""
    link_bps, _ = slowest_link_goodput(scenario)
    nccl = workload.backend == "nccl" and scenario.topology.nodes > 1
    probing: _ProbeAttempts | None = None
    # Under NCCL the probe also runs without fidelity: its log shows NCCL's transport between
    # nodes, which must be verified before anything is measured.
    if (scenario.fidelity.enabled or nccl) and scenario.topology.nodes > 1:
        progress(f"{scenario.name}: all-reduce probe (can this host drive the links?)")
        # A script's launches are its own: the probe gets a launch of its own before them.
        if gated_probe and not nccl and not workload.is_script:
            probing = _ProbeAttempts(scenario, workload)
        else:
            fidelity = _probe_collective(launcher, scenario, out / "probe", timeout_s,
                                         progress, watch(None), workload=workload,
                                         attempts=None if scenario.fidelity.enabled else 1)
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
    if schedule and scheduler is None:
        raise WorkloadError(f"{scenario.name}: [[link.schedule]] is not supported by this "
                            "launcher; remove it or run the scenario with `netsim-ddp run`")
    report.link_schedule = scheduler(schedule, signals) if schedule and scheduler else None
    try:
        with traffic(signals) as flows, report.link_schedule or contextlib.nullcontext():
            gate = (_ProbeGate(probing, out / "train", allow_untrusted, progress, on_train)
                    if probing else None)
            results = launcher(spec, out / "train", timeout_s, profile=profile,
                               env={NODE_ENV: "1", SIGNAL_DIR_ENV: str(signals)},
                               watchdog=_chained(gate, watch(flows)))
            report.host_load = CpuLoad.between(before, CpuTimes.read())
            background = flows.stop()
    except _ProbeRefused:
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


def delay_line_checks(monitors, final_stats: dict[str, dict[str, object]],
                      results: dict[str, ModeResult], multi_node: bool) -> list[Verdict]:
    """Each mode's measured window, then the forwarders' whole life (the probe included),
    against the bounds in fabric/delayline/health.py; none without a delay line."""
    if not final_stats and not monitors:
        return []
    checks = []
    for mode, result in results.items():
        window = _measured_window(result)
        if window is None:
            continue  # no link marks: measurement_checks reports that
        found = delay_line_health.judge_window(monitors, *window, expect_traffic=multi_node)
        checks.append(Verdict(f"delay-line:{mode}", all(h.passed for h in found),
                              f"in {mode}'s measured window: " + "; ".join(
                                  h.detail for h in found if not h.passed or
                                  all(h.passed for h in found))))
    final = delay_line_health.judge_final(final_stats)
    checks.append(Verdict("delay-line", all(h.passed for h in final),
                          "over the whole run: " + "; ".join(h.detail for h in final)))
    return checks


def measurement_checks(modes: dict[str, ModeReport], nodes: int) -> list[Verdict]:
    """A counter that saw nothing is a broken measurement, never a zero: the comm hook must
    have counted gradient bytes wherever there is more than one rank, and across nodes the
    links must have carried more than the background traffic did."""
    checks = []
    for mode, report in modes.items():
        problems = []
        script = report.result.script
        ddp = script is None or script.ddp_models > 0  # a script may train without DDP
        if (report.result.world_size > 1 and ddp
                and report.result.sent_bytes_per_iteration <= 0):
            problems.append("the comm hook counted no gradient bytes (did it run?)")
        if script is not None and nodes > 1 and not report.wire_bytes_per_iteration > 0:
            problems.append(
                f"the script's ranks put {report.wire_bytes_per_iteration:.0f} bytes per step "
                f"on the links (DDP models: {script.ddp_models}): its ranks do not exchange "
                "gradients, so each trains a model of its own")
        elif nodes > 1 and not report.wire_bytes_per_iteration > 0:
            problems.append(
                f"the links carried {report.wire_bytes_per_iteration:.0f} training bytes per "
                f"iteration after subtracting {report.background_bytes_per_iteration:.0f} of "
                "background: the link counters or the background accounting are broken")
        if problems:
            checks.append(Verdict(f"measured:{mode}", False, f"{mode}: " + "; ".join(problems)))
    return checks


BACKGROUND_MIN_ON_S = 0.05  # a flow scheduled on for less may fairly have sent nothing


def background_checks(flows, background: BackgroundBytes,
                      results: dict[str, ModeResult]) -> list[Verdict]:
    """Did every flow send within each mode's measured window when its schedule was on? A
    flow that sent nothing there left the mode uncontended, and 0 background bytes would read
    as a measurement."""
    if not flows:
        return []
    if len(background.senders) != len(flows):
        return [Verdict("background", False, f"{len(flows)} flows but {len(background.senders)} "
                                             "senders reported their counters")]
    checks = []
    for mode, result in results.items():
        window = _measured_window(result)
        if window is None:
            continue
        notes, silent = [], False
        for index, (flow, series) in enumerate(zip(flows, background.senders, strict=True)):
            on_s = scheduled_on_s(flow, window[1] - window[0])
            sent = BackgroundBytes((series,)).between(*window)
            name = f"flow {index} ({flow.source} -> {flow.destination})"
            if on_s >= BACKGROUND_MIN_ON_S and not sent > 0:
                silent = True
                notes.append(f"{name} was scheduled on for {on_s:.2f} s but sent nothing")
            else:
                notes.append(f"{name} sent {sent / 1e6:.1f} MB in {on_s:.2f} s scheduled on")
        checks.append(Verdict(f"background:{mode}", not silent,
                              f"in {mode}'s measured window: " + "; ".join(notes)))
    return checks


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


def wire_ratio_checks(modes: dict[str, ModeReport]) -> list[Verdict]:
    """Does each mode put on the wire what its wire dtype promises, relative to fp32?"""
    checks = []
    reference = REFERENCE_MODE
    for mode in modes:
        if mode == reference or mode not in MODES:
            continue
        expected = wire_ratio(mode, reference)
        # One node sends nothing over the network: no ratio to check.
        if reference in modes and modes[reference].wire_bytes_per_iteration:
            ratio = (modes[mode].wire_bytes_per_iteration
                     / modes[reference].wire_bytes_per_iteration)
            ok = abs(ratio - expected) <= WIRE_RATIO_TOLERANCE
            checks.append(Verdict(
                f"wire-bytes:{mode}/{reference}", ok,
                f"{mode} put {ratio:.3f} x {reference}'s bytes on the wire per iteration "
                f"(expected {expected:.2f} +- {WIRE_RATIO_TOLERANCE})"))
    return checks


def crossing_checks(scenario: Scenario, modes: dict[str, ModeReport]) -> list[Verdict]:
    """Per mode: did its all-reduces cross the shaped links, as many bytes as they should?
    (verdicts.crossing). Nothing to check with one node: no link carries the collectives."""
    topology = scenario.topology
    if topology.nodes < 2:
        return []
    checks = []
    for name, mode in modes.items():
        result = mode.result
        expectation = expected_cross_node(result.backend, topology.nodes,
                                          topology.ranks_per_node,
                                          result.sent_bytes_per_iteration, scenario.link.mtu)
        verdict = CrossingVerdict(name, expectation, mode.wire_bytes_per_iteration)
        checks.append(Verdict(f"crossed:{name}", verdict.passed, verdict.detail))
    return checks


def _link_marks(result: ModeResult) -> list[tuple[dict[str, float], dict[str, float]]]:
    """(start, end) link counters of every node: local rank 0 of each reads its node's."""
    nodes = result.world_size // max(result.local_world_size, 1)
    leaders = [rank for rank in result.ranks if rank.local_rank == 0]
    missing = [rank.rank for rank in leaders if not rank.link_marks]
    if missing or len(leaders) != nodes:
        raise WorkloadError(
            f"mode {result.mode}: {len(leaders) - len(missing)} of {nodes} nodes reported their "
            f"link counters (ranks {missing} did not): their bytes would count as zero")
    marks = []
    for rank in leaders:
        assert rank.link_marks is not None
        if len(rank.link_marks) != 2:
            raise WorkloadError(f"mode {result.mode}: rank {rank.rank} reported "
                                f"{len(rank.link_marks)} link marks, not start and end")
        start, end = rank.link_marks
        if end["sent_bytes"] < start["sent_bytes"] or end["monotonic_s"] < start["monotonic_s"]:
            raise WorkloadError(f"mode {result.mode}: rank {rank.rank}'s link counters went "
                                f"backwards ({start} -> {end})")
        marks.append((start, end))
    return marks


def _measured_window(result: ModeResult) -> tuple[float, float] | None:
    """(start, end) CLOCK_MONOTONIC of the mode's measured iterations, from the link marks."""
    marks = [rank.link_marks for rank in result.ranks if rank.link_marks]
    if not marks:
        return None
    return (min(m[0]["monotonic_s"] for m in marks), max(m[-1]["monotonic_s"] for m in marks))


def _window_bytes(result: ModeResult, background: BackgroundBytes) -> tuple[float, float]:
    """(all bytes the nodes sent, background's share) within the mode's measured window."""
    marks = _link_marks(result)
    total = sum(end["sent_bytes"] - start["sent_bytes"] for start, end in marks)
    begin = min(start["monotonic_s"] for start, _ in marks)
    finish = max(end["monotonic_s"] for _, end in marks)
    return total, background.between(begin, finish)


def _probe_results(out: Path, dtypes: Sequence[str]) -> tuple[dict[str, float], list]:
    """Each dtype's median bus bandwidth from one probe attempt, and the attempt's results
    as read; a missing file, dtype or
    timing is an error, never a bandwidth (a zero duration would read as infinitely fast)."""
    try:
        results = read_probe(out)
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"the all-reduce probe left no readable result in {out}: {exc}") \
            from None
    by_dtype: dict[str, float] = {}
    for result in results:
        if not result.seconds or not all(0 < s < math.inf for s in result.seconds):
            raise WorkloadError(f"the all-reduce probe timed {result.dtype} as {result.seconds} "
                                "s: no usable measurement")
        by_dtype[result.dtype] = summarize(busbw_samples(result)).median
    if missing := [dtype for dtype in dtypes if dtype not in by_dtype]:
        raise WorkloadError(f"the all-reduce probe reported nothing for {', '.join(missing)} "
                            f"(asked {', '.join(dtypes)})")
    return by_dtype, results


def _check_background_followed(result: ModeResult, background: BackgroundBytes) -> None:
    """Every background sender must have followed this mode's measured window; else the
    background bytes are not a measurement of it (0 would pass for "no traffic")."""
    marks = [rank.link_marks for rank in result.ranks if rank.link_marks]
    begin = min(start["monotonic_s"] for start, _ in marks)
    finish = max(end["monotonic_s"] for _, end in marks)
    missed = background.missed_window(result.mode, begin, finish)
    if missed:
        raise WorkloadError(f"mode {result.mode}: background traffic did not run in its measured "
                            f"window: {'; '.join(missed)}")


class _ProbeAttempts:
    """The all-reduce probe's attempts and their verdict: attempt after attempt until one
    reaches fidelity.min_fraction or none are left. `workload`: with the backend resolved."""

    def __init__(self, scenario: Scenario, workload, attempts: int | None = None):
        size = min(max(workload.params * 4, PROBE_MIN_BYTES), PROBE_MAX_BYTES)
        # A script's wire dtype is its own business: the probe times float32.
        self.dtypes = (["float32"] if workload.is_script else
                       list(dict.fromkeys(get_mode(mode).wire_dtype for mode in workload.modes)))
        self.probe = AllreduceProbe.model_validate({"size_bytes": size, "dtypes": self.dtypes})
        _, goodput = slowest_link_goodput(scenario)
        world = scenario.topology.nodes * scenario.topology.ranks_per_node
        self.fidelity = CollectiveFidelity(size, world, [], goodput,
                                           scenario.fidelity.min_fraction)
        self.limit = attempts or scenario.fidelity.attempts
        # Generous: every dtype's timed all-reduces (and warm-up) at 20x the ideal ring time.
        ideal = ring_allreduce_lower_bound(size, world, goodput)
        self.attempt_timeout_s = 20 * ideal * len(self.dtypes) * (
            self.probe.warmup + self.probe.iterations)
        self.name = scenario.name

    def judge(self, attempt_out: Path) -> bool:
        """Read one attempt's results into the fidelity; True once no attempt is to follow
        (this one reached min_fraction, or went over the cap, or it was the last)."""
        by_dtype, results = _probe_results(attempt_out, self.dtypes)
        fidelity = self.fidelity
        fidelity.host_load = next((CpuLoad(**r.host_load) for r in reversed(results)
                                   if r.host_load), None)
        fidelity.dtype_bps.append(by_dtype)
        fidelity.attempts_bps.append(min(by_dtype.values()))
        # More attempts cannot undo an overshoot.
        reached = fidelity.fraction >= fidelity.min_fraction
        return reached or len(fidelity.attempts_bps) >= self.limit

    def retrying(self) -> str:
        return (f"{self.name}: all-reduce probe attempt {len(self.fidelity.attempts_bps) + 1} of "
                f"{self.limit} (so far {self.fidelity.fraction:.0%} of the link)")


def _probe_collective(launcher: Launcher, scenario: Scenario, out: Path,
                      timeout_s: float | None, progress: Progress,
                      watchdog: Callable[[], None] | None = None, *, workload=None,
                      attempts: int | None = None) -> CollectiveFidelity:
    """The probe in launches of its own, one per attempt (where the launcher cannot hold the
    training back while the harness judges it: multi-host, and NCCL, whose transport is read
    from the probe launch's finished logs). `workload`: with the backend resolved (default:
    the scenario's)."""
    workload = workload or scenario.workload
    assert workload is not None  # only a training scenario is probed
    probing = _ProbeAttempts(scenario, workload, attempts)
    spec = RankSpec(workload=workload, modes=[], allreduce_probe=probing.probe)
    for attempt in range(probing.limit):
        if attempt:
            progress(probing.retrying())
        attempt_out = out / f"attempt{attempt}"
        launcher(spec, attempt_out, timeout_s or 90 + probing.attempt_timeout_s,
                 watchdog=watchdog)
        if probing.judge(attempt_out):
            break
    return probing.fidelity


class _ProbeRefused(Exception):
    """Raised from the launch's watchdog: the host cannot drive the links; the launch ends."""


class _ProbeGate:
    """The probe inside the training launch (RankSpec.probe_gated), one start-up instead of two:
    called with the launch's watchdog, it judges each attempt as its results appear and tells
    the ranks to probe again or to train, or ends the launch (_ProbeRefused) when the host
    cannot drive the links and the run may not go on untrusted."""

    def __init__(self, probing: _ProbeAttempts, launch_out: Path, allow_untrusted: bool,
                 progress: Progress, on_train: Callable[[], None]):
        self.probing, self.launch_out = probing, launch_out
        self.allow_untrusted, self.progress, self.on_train = allow_untrusted, progress, on_train
        self.decided = False

    def __call__(self) -> None:
        if self.decided:
            return
        # the next attempt to judge: one per attempt judged so far
        folder = attempt_dir(self.launch_out, len(self.probing.fidelity.attempts_bps))
        if not (folder / PROBE_RESULT_FILE).exists():
            return
        if not self.probing.judge(folder):
            self.progress(self.probing.retrying())
            give_verdict(folder, AGAIN)
            return
        self.decided = True
        if not (self.probing.fidelity.trusted or self.allow_untrusted):
            raise _ProbeRefused(self.probing.fidelity.reason)
        self.on_train()
        give_verdict(folder, TRAIN)


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
