"""One scenario's outcome: what each mode measured, the probe's trust, and every check's
verdict; and the results document a run writes from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from netsim_ddp.common.version import __version__
from netsim_ddp.fabric.schedule import LinkScheduler
from netsim_ddp.hostfacts.hostload import CpuLoad
from netsim_ddp.hostfacts.nccl import TransportEvidence
from netsim_ddp.hostfacts.placement import Placement
from netsim_ddp.measure.attribution import CounterSeries
from netsim_ddp.measure.document import ResultsDocument, ScenarioRecord
from netsim_ddp.measure.machine import content_digest
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.measure.target_time import notice
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.target_busbw import TargetBusbw
from netsim_ddp.verdicts.busbw_checks import busbw_record
from netsim_ddp.verdicts.gate import Verdict

UNTRUSTED_ADVICE = ("try a quieter host (nothing else running), a larger emulation.dilation "
                    "(or dilation = \"auto\"), fewer ranks per node, or more iterations")


@dataclass
class ScenarioReport:
    scenario: Scenario
    run_id: str = ""
    fidelity: CollectiveFidelity | None = None
    refused: str | None = None
    error: str | None = None  # the run broke (a rank crashed or hung, the host lacks something)
    modes: dict[str, ModeReport] = field(default_factory=dict)
    checks: list[Verdict] = field(default_factory=list)
    delay_backends: dict[str, str | None] = field(default_factory=dict)
    delay_line_stats: dict[str, dict[str, object]] = field(default_factory=dict)
    tcp_settings: dict[str, dict[str, str | int]] = field(default_factory=dict)  # kernel-read
    host_load: CpuLoad | None = None  # the host's CPUs while the modes trained
    link_schedule: LinkScheduler | None = None  # what [[link.schedule]] did, per mode
    # multi-host: per node, its host and NIC; `machine`: per machine, its host, NIC and nodes
    hosts: dict[str, dict[str, object]] | None = None
    out_dir: Path | None = None  # this run's own folder: logs, results, signals
    placement: Placement | None = None  # backend, each rank's GPU, per-node environment
    transport: TransportEvidence | None = None  # NCCL's own account of its links (NCCL only)
    # A scale model (scenario.dilation): the scenario the host ran (rates / k ...), the k, and
    # how "auto" chose it. `scenario` stays the target's; every reported time is the target's.
    host_scenario: Scenario | None = None
    dilation: float = 1.0
    dilation_chosen: str | None = None
    retried: str | None = None  # what was tried again before this run's outcome, and why
    machines: int = 1  # `netsim-ddp machine`: the machines the fabric was spread over
    target_busbw: TargetBusbw | None = None  # [link] busbw_from: the links' plan for it
    uplinks: dict[str, dict[str, int | None]] = field(default_factory=dict)  # racks, whole run
    # counters sampled while the ranks ran (the racks' uplink drops, the job's and a
    # neighbour's connections' losses): the tail's evidence
    counters: list[CounterSeries] = field(default_factory=list)

    @property
    def compute_source(self) -> str:
        workload = self.scenario.workload
        return workload.compute_source if workload is not None else "real"

    @property
    def notice(self) -> str | None:
        """The scale model's one line (None: real time, real compute)."""
        return notice(self.dilation, self.compute_source, self.machines)

    @property
    def status(self) -> str:
        """One of the four outcomes (measure.record.Status): "error" when the run broke;
        "failed" when a check about the code under test failed; "untrusted" when the probe
        refused this host or a check of its emulation failed (and none of the code); else
        "passed"."""
        if self.error:
            return "error"
        if any(not check.passed and check.kind == "code" for check in self.checks):
            return "failed"
        if self.refused or not all(check.passed for check in self.checks):
            return "untrusted"
        return "passed"

    def _host_misses(self) -> list[Verdict]:
        """The failed checks of this host's emulation (the probe's own when it refused: the
        refusal says it)."""
        return [check for check in self.checks if not check.passed and check.kind == "host"
                and not (self.refused and check.name == "fidelity")]

    @property
    def untrusted_checks(self) -> list[str]:
        """The names of what this host failed to emulate: the probe's refusal, each failed
        emulation check."""
        return (["probe refused"] if self.refused else []) + [
            check.name for check in self._host_misses()]

    @property
    def untrusted_reason(self) -> str | None:
        """Why an untrusted run is untrusted: the probe's refusal or each failed emulation
        check, what the host's CPUs did meanwhile, and what to try. None unless untrusted."""
        if self.status != "untrusted":
            return None
        reasons = ([self.refused] if self.refused else []) + [
            f"{check.name}: {check.detail}" for check in self._host_misses()]
        if self.host_load is not None:
            reasons.append(self.host_load.describe())
        return ("; ".join(reasons) + ". This host could not emulate the scenario faithfully, "
                "so nothing was judged: " + UNTRUSTED_ADVICE)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_record(self) -> ScenarioRecord:
        scenario = self.scenario.model_dump(mode="json")
        return ScenarioRecord.model_validate({
            "name": self.scenario.name,
            "file": str(self.scenario.path) if self.scenario.path else None,
            "passed": self.passed,
            "status": self.status,
            "refused": self.refused,
            "untrusted": self.untrusted_reason,
            "retried": self.retried,
            "error": self.error,
            "run_id": self.run_id,
            "out_dir": str(self.out_dir) if self.out_dir else None,
            "fidelity": self.fidelity.to_record() if self.fidelity else None,
            "host_load": self.host_load.as_dict() if self.host_load else None,
            "network": {"delay_backends": self.delay_backends,
                        "delay_line": self.delay_line_stats, "tcp": self.tcp_settings,
                        "busbw_from": busbw_record(self.target_busbw, self.fidelity,
                                                   self.dilation),
                        "uplinks": self.uplinks},
            "link_schedule": ([{"mode": w.mode, "start_monotonic": w.start_monotonic,
                                "end_monotonic": w.end_monotonic,
                                "changes": [c.as_dict() for c in w.changes]}
                               for w in self.link_schedule.windows]
                              if self.link_schedule else None),
            "hosts": self.hosts,
            "placement": self.placement.as_dict() if self.placement else None,
            "transport": self.transport.as_dict() if self.transport else None,
            "modes": {name: report.to_record() for name, report in self.modes.items()},
            "checks": [check.to_record() for check in self.checks],
            "scenario": scenario,
            "scenario_digest": content_digest(scenario),
            "emulation": ({"dilation": self.dilation, "compute_source": self.compute_source,
                           "notice": self.notice, "chosen": self.dilation_chosen}
                          if self.notice else None),
        }, strict=False)


def results_document(reports: list[ScenarioReport], sweeps=()) -> ResultsDocument:
    """The document of a run: its scenarios, and its sweeps (netsim_ddp.run.sweep.SweepReport)."""
    return ResultsDocument.new(__version__, [report.to_record() for report in reports],
                               [sweep.to_record() for sweep in sweeps])
