"""Judging a finished run, one code path for every launcher: the wire accounting per mode,
then every check in order (measurements, replay, framework, TCP, background flows, wire ratio,
crossing, link schedule) and the scenario's expectations."""

from __future__ import annotations

from netsim_ddp.fabric.background import BackgroundBytes
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.wire import check_background_followed, window_bytes
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.verdicts.gate import default_expectations, evaluate
from netsim_ddp.verdicts.run_checks import (
    background_checks,
    crossing_checks,
    measurement_checks,
    replay_checks,
    wire_ratio_checks,
)
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.verdicts.schedule_checks import attach_link_states, schedule_checks
from netsim_ddp.verdicts.script_checks import framework_checks
from netsim_ddp.verdicts.tcp_checks import tcp_checks
from netsim_ddp.workload import ModeResult
from netsim_ddp.workload.contract.noise_draws import NoiseModel


def judge_run(report: ScenarioReport, results: dict[str, ModeResult],
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
