"""Checks of a user's script run: where a framework's device-dependent path made the CPU ranks
run something other than the target's GPUs (workload.framework_paths), with the wire bytes and
the DDP hooks seen as witnesses."""

from __future__ import annotations

from netsim_ddp.verdicts.gate import Verdict, host_verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport


def framework_checks(report: ScenarioReport) -> list[Verdict]:
    checks = []
    for name, mode in report.modes.items():
        script = mode.result.script
        if script is None:
            continue
        seen = (f" (DDP's comm hooks: {', '.join(script.comm_hooks) or 'none'}; "
                f"{mode.wire_bytes_per_iteration / 1e6:.2f} MB per step on the wire, "
                f"{mode.result.sent_bytes_per_iteration / 1e6:.2f} MB handed to DDP's hook)")
        checks += [host_verdict(f"framework:{name}", True, f"{name}: {note}{seen}")
                   for note in script.framework_adjusted]
        checks += [host_verdict(f"framework:{name}", False, f"{name}: {note}{seen}")
                   for note in script.framework_differs]
    return checks
