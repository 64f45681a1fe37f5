"""`fidelity:tcp:MODE`: did a scale model's TCP time out on the host's clock?

A retransmission timeout costs the target its minimum RTO (200 ms by default); a scale model
whose nodes kept the kernel's undilated minimum pays 200/k ms of target time for it, so one
timeout makes every time it measured too short. Each dilated mode gets this check: it fails
when the nodes' minimum RTO (as the kernel held it) was not the target's x k and TCP timed out
in the measured window, and says how many times.
"""

from __future__ import annotations

from netsim_ddp.measure.tcp_evidence import loss_summary, rto_dilated, tcp_counters, totals
from netsim_ddp.scenario.tcp import rto_min_s
from netsim_ddp.scenario.units import format_duration
from netsim_ddp.verdicts.gate import Verdict, host_verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport


def tcp_checks(report: ScenarioReport) -> list[Verdict]:
    if report.dilation == 1:
        return []  # real time: the kernel's clocks are the target's
    target = rto_min_s(report.scenario.link.tcp)
    dilated = rto_dilated(report.tcp_settings, target, report.dilation)
    rto = (f"the nodes' minimum RTO was {format_duration(target)} x {report.dilation:g}"
           if dilated else
           f"the nodes' minimum RTO was NOT dilated (the target's {format_duration(target)} "
           f"x {report.dilation:g} was not in the kernel: {report.tcp_settings or 'not read'})")
    checks = []
    for name, mode in report.modes.items():
        records = tcp_counters(mode.result)
        if records is None:
            continue  # the nodes did not read their counters: nothing to judge
        timeouts = totals(records).get("TCPTimeouts", 0)
        passed = dilated or timeouts == 0
        evidence = loss_summary(records) or "no retransmission"
        checks.append(host_verdict(
            f"fidelity:tcp:{name}", passed,
            f"{name}: {rto}; TCP in the measured window: {evidence}"
            + ("" if passed else f": {timeouts} timeouts each cost {report.dilation:g}x too "
               "little target time; run it where the fabric sets the nodes' TCP clocks")))
    return checks
