"""The checks of one trained scenario: did the delay line keep up, is every measurement a
measurement, did the background flows send, does each mode's wire ratio hold, did the
collectives cross the links, did the host keep the replay's schedule."""

from __future__ import annotations

import statistics

from netsim_ddp.fabric.background import BackgroundBytes, scheduled_on_s
from netsim_ddp.fabric.delayline import health as delay_line_health
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.target_time import replay_late_s, replayed_compute_s
from netsim_ddp.measure.wire import link_marks_window
from netsim_ddp.precision.modes import (
    MODES,
    REFERENCE_MODE,
    wire_ratio,
)
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.verdicts.crossing import CrossingVerdict, expected_cross_node
from netsim_ddp.verdicts.gate import Verdict, host_verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import ModeResult

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
        compute = replayed_compute_s(mode)  # the schedule's (a script's: its ranks' schedule)
        if late is None or workload is None or compute is None:
            continue  # not replayed (a user's script never is: it has no compute-only steps)
        bound = max(REPLAY_LATE_FRACTION * compute, REPLAY_LATE_FLOOR_S)
        median = statistics.median(late)
        advice = ("" if median <= bound else
                  ": the host could not keep the schedule; raise emulation.dilation")
        checks.append(host_verdict(
            f"fidelity:replay:{name}", median <= bound,
            f"{name}: the host released gradients a median {median * 1e3:.2f} ms (max "
            f"{max(late) * 1e3:.2f} ms) later than the replay asked, target time; allowed "
            f"{bound * 1e3:.2f} ms ({REPLAY_LATE_FRACTION:.0%} of {compute * 1e3:.0f} ms "
            f"compute){advice}"))
    return checks


def delay_line_checks(monitors, final_stats: dict[str, dict[str, object]],
                      results: dict[str, ModeResult], multi_node: bool) -> list[Verdict]:
    """Each mode's measured window, then the forwarders' whole life (the probe included),
    against the bounds in fabric/delayline/health.py; none without a delay line."""
    if not final_stats and not monitors:
        return []
    checks = []
    for mode, result in results.items():
        window = link_marks_window(result)
        if window is None:
            continue  # no link marks: measurement_checks reports that
        found = delay_line_health.judge_window(monitors, *window, expect_traffic=multi_node)
        checks.append(host_verdict(f"delay-line:{mode}", all(h.passed for h in found),
                                   f"in {mode}'s measured window: " + "; ".join(
                                  h.detail for h in found if not h.passed or
                                  all(h.passed for h in found))))
    final = delay_line_health.judge_final(final_stats)
    checks.append(host_verdict("delay-line", all(h.passed for h in final),
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
        return [host_verdict("background", False, f"{len(flows)} flows but "
                             f"{len(background.senders)} senders reported their counters")]
    checks = []
    for mode, result in results.items():
        window = link_marks_window(result)
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
        checks.append(host_verdict(f"background:{mode}", not silent,
                                   f"in {mode}'s measured window: " + "; ".join(notes)))
    return checks


WIRE_RATIO_TOLERANCE = 0.03  # of the ratio: DDP's own few bytes outside the buckets


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
        checks.append(host_verdict(f"crossed:{name}", verdict.passed, verdict.detail))
    return checks
