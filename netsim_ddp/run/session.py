"""A session of scenario runs, as the CLI and the pytest plugin share it: options, the
baseline to gate against, the reports gathered, and what is written at the end."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netsim_ddp.common.options import DEFAULT_ALPHA, SESSION_OPTIONS
from netsim_ddp.fabric import FabricError
from netsim_ddp.hostfacts.hostload import STEAL_NOTICEABLE, max_steal
from netsim_ddp.measure.document import ResultsDocument
from netsim_ddp.measure.document import save as save_document
from netsim_ddp.report.ci import STEP_SUMMARY, append_step_summary, history_summary, run_summary
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.scenario.limits import check_host
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.verdicts.baseline import Baseline, BaselineError, save
from netsim_ddp.verdicts.gate import Tolerance, Verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport, results_document
from netsim_ddp.workload import WorkloadError

DEFAULT_TOLERANCES = ("median:10%",)


class SessionOptionError(ValueError):
    """A bad option: a tolerance that cannot be read, a baseline that cannot be used."""


@dataclass
class NetsimSession:
    tolerances: list[Tolerance]
    alpha: float = DEFAULT_ALPHA
    baseline: Baseline | None = None
    save_baseline: Path | None = None
    json_path: Path | None = None
    iterations: int | None = None
    out_dir: Path | None = None
    allow_untrusted: bool = False
    timeout_s: float | None = None
    scenario_dirs: list[Path] = field(default_factory=list)
    explicit_files: set[Path] = field(default_factory=set)
    reports: list[ScenarioReport] = field(default_factory=list)
    sweeps: list = field(default_factory=list)  # netsim_ddp.run.sweep.SweepReport
    # Said before the runs and again in the summary: e.g. a baseline from another machine.
    warnings: list[str] = field(default_factory=list)
    # A folder of earlier runs' results: each run is added to it and judged against it.
    history_dir: Path | None = None
    history_tolerances: list[str] = field(default_factory=list)  # as given: METRIC:PCT

    @classmethod
    def create(cls, *, tolerances: list[str] | None = None, baseline: str | None = None,
               **options) -> NetsimSession:
        try:
            parsed = [Tolerance.parse(text) for text in (tolerances or DEFAULT_TOLERANCES)]
            loaded = Baseline(baseline) if baseline else None
        except (ValueError, BaselineError) as exc:
            raise SessionOptionError(str(exc)) from None
        if not 0 < options.get("alpha", DEFAULT_ALPHA) < 1:
            raise SessionOptionError(f"alpha must be between 0 and 1, got {options['alpha']}")
        warning = loaded.machine_warning() if loaded else None
        if options.get("history_dir") is not None:
            from netsim_ddp.verdicts.history import HistoryError, parse_metrics

            try:
                parse_metrics([], tolerances or [])
            except HistoryError as exc:
                raise SessionOptionError(str(exc)) from None
            options["history_tolerances"] = list(tolerances or [])
        return cls(tolerances=parsed, baseline=loaded, warnings=[warning] if warning else [],
                   **options)

    @classmethod
    def from_config(cls, config) -> NetsimSession:
        """From pytest's options."""
        def option(name: str) -> Any:
            return config.getoption(SESSION_OPTIONS[name].pytest_dest)

        root = Path(config.rootpath)
        path = lambda value: Path(value) if value else None  # noqa: E731
        return cls.create(
            tolerances=option("tolerance"), baseline=option("baseline"),
            alpha=option("alpha"), save_baseline=path(option("save-baseline")),
            json_path=path(option("json")), iterations=option("iterations"),
            out_dir=path(option("out")), allow_untrusted=option("allow-untrusted"),
            history_dir=path(option("history")),
            scenario_dirs=[(root / d).resolve() for d in config.getini("netsim_scenario_dirs")],
            explicit_files={Path(arg.split("::")[0]).resolve() for arg in config.args},
        )

    def is_scenario_file(self, path: Path) -> bool:
        """Scenario folders' *.toml files, and any .toml named on the command line (never a
        pyproject.toml met on the way)."""
        path = path.resolve()
        return path in self.explicit_files or any(d in path.parents for d in self.scenario_dirs)

    def _options(self, scenario: Scenario) -> dict[str, Any]:
        return {"iterations": self.iterations, "allow_untrusted": self.allow_untrusted,
                "timeout_s": self.timeout_s,
                "out_dir": scenario_folder(self.out_dir, scenario) if self.out_dir else None}

    def run_sweep(self, scenario: Scenario, **overrides):
        """A scenario with a [sweep]: every point, the cost model, held-out check and projection. A
        point that breaks is recorded as an error and the sweep goes on with the next."""
        from netsim_ddp.run.sweep import run_sweep

        assert scenario.sweep is not None
        runner = overrides.pop("runner", run_scenario)
        sweep = run_sweep(scenario, scenario.sweep, **(self._options(scenario) | overrides),
                          runner=lambda one, **kwargs: _recorded(
                              one, lambda: runner(one, **kwargs)))
        self.sweeps.append(sweep)
        return sweep

    def run(self, scenario: Scenario, **overrides) -> ScenarioReport:
        """Run one scenario; whatever breaks it is recorded in its report as an error."""
        runner = overrides.pop("runner", run_scenario)
        report = _recorded(scenario, lambda: runner(
            scenario, **(self._options(scenario) | overrides)))
        if self.baseline is not None and report.modes:
            report.checks.extend(self.gate(report))
        if self.history_dir is not None and report.modes:
            report.checks.extend(self.judge_history(report))
        self.reports.append(report)
        return report

    def judge_history(self, report: ScenarioReport) -> list[Verdict]:
        """Add this run to the history folder, then judge it against the runs before it:
        the verdicts of its scenario's current series (netsim_ddp.verdicts.history)."""
        assert self.history_dir is not None
        from netsim_ddp.verdicts.history import (
            HistoryError,  # brings ruptures (seconds): only with a history
        )

        document = results_document([report])
        stamp = (document.created_at or "").replace("-", "").replace(":", "").replace("+", "_")
        save_document(document, self.history_dir / f"{stamp}-{report.scenario.name}"
                                                    f"-{report.run_id or 'run'}.json")
        try:
            judged = self.history()
        except HistoryError as exc:  # a clear failure, never a silent pass
            return [Verdict("history", False, str(exc))]
        return [history.verdict for history in judged.metrics
                if history.key.scenario == report.scenario.name and history.gating
                and history.verdict is not None]

    def history(self):
        """The history folder judged (netsim_ddp.verdicts.history.HistoryReport)."""
        from netsim_ddp.verdicts.history import judge_history, load_runs, parse_metrics, runs_in

        assert self.history_dir is not None
        metrics, tolerances = parse_metrics([], self.history_tolerances)
        runs, notes = load_runs(runs_in(self.history_dir))
        judged = judge_history(runs, metrics, tolerances, self.alpha)
        judged.notes[:0] = notes
        return judged

    def gate(self, report: ScenarioReport) -> list[Verdict]:
        assert self.baseline is not None
        try:
            return self.baseline.compare(report, self.tolerances, self.alpha)
        except BaselineError as exc:  # a clear failure, never a silent pass
            return [Verdict("baseline", False, str(exc))]

    def document(self) -> ResultsDocument:
        return results_document(self.reports, self.sweeps)

    def finish(self) -> None:
        if self.json_path is not None:
            save_document(self.document(), self.json_path)
        measured = [report for report in self.reports if report.modes]
        if self.save_baseline is not None and measured:
            save(measured, self.save_baseline)
        self._step_summary()

    def _step_summary(self) -> None:
        """On GitHub Actions, the results (and the history's verdicts) on the job's page."""
        if not os.environ.get(STEP_SUMMARY) or not (self.reports or self.sweeps):
            return
        append_step_summary(run_summary(self.document()))
        if self.history_dir is not None and any(report.modes for report in self.reports):
            from netsim_ddp.verdicts.history import HistoryError

            try:
                append_step_summary(history_summary(self.history()))
            except HistoryError as exc:
                append_step_summary(f"## netsim-ddp history\n\n{exc}")

    # -- what people read ---------------------------------------------------------------------

    def summary_lines(self) -> list[str]:
        if not self.reports and not self.sweeps:
            return []
        lines = ["", "netsim-ddp scenarios (medians; comm = exposed communication)"]
        lines += [f"  {warning}" for warning in self.warnings]
        lines += self._untrusted_lines()
        for report in self.reports:
            failed = sum(not check.passed for check in report.checks)
            lines.append(f"  {report.scenario.name}: {report.status.upper()}"
                         + (f", {failed} failed check(s)" if failed else "")
                         + probe_summary([report]))
            warning = steal_warning([report])
            lines += [f"    {warning}"] if warning else []
            lines += [f"    {report.notice}"] if report.notice and report.modes else []
            for mode, result in report.modes.items():
                lines.append(f"    {mode:<9} iteration {result.iteration.median * 1e3:8.1f} ms"
                             + (f"  comm {result.comm.median * 1e3:8.1f} ms"
                                f" (sd {result.comm.std * 1e3:6.1f})" if result.comm else "")
                             + (f"  collective {result.collective.median * 1e3:8.1f} ms"
                                f" (sd {result.collective.std * 1e3:6.1f})"
                                if result.collective else "")
                             + f"  wire {result.wire_bytes_per_iteration / 1e6:8.2f} MB/it")
        for sweep in self.sweeps:
            held_out = (f"held-out error up to {sweep.held_out.max_abs_error:.1%} (target "
                        f"{sweep.held_out.target:.0%}: {sweep.held_out.verdict})"
                        if sweep.held_out else "no held-out check")
            lines.append(f"  {sweep.scenario.name}: sweep {sweep.status.upper()}"
                         f", {len(sweep.points)} points, {held_out}"
                         + probe_summary([point.report for point in sweep.points]))
            warning = steal_warning([point.report for point in sweep.points])
            lines += [f"    {warning}"] if warning else []
        if self.save_baseline is not None:
            lines.append(f"  baseline saved to {self.save_baseline}")
        if self.json_path is not None:
            lines.append(f"  results written to {self.json_path}")
        return lines

    def _untrusted_lines(self) -> list[str]:
        """"2 of 9 scenarios untrusted on this host: ...": skipped is not passed, and a CI log
        must say how much went unmeasured."""
        runs = [(r.scenario.name, r.status, r.untrusted_checks) for r in self.reports]
        runs += [(s.scenario.name, s.status, [f"sweep: {len(s.refusals)} reason(s)"])
                 for s in self.sweeps]
        untrusted = [(name, why) for name, status, why in runs if status == "untrusted"]
        if not untrusted:
            return []
        return [f"  {len(untrusted)} of {len(runs)} scenarios untrusted on this host (nothing "
                "judged): " + "; ".join(f"{name} ({', '.join(why)})" for name, why in untrusted)]

    @staticmethod
    def properties(report: ScenarioReport) -> list[tuple[str, object]]:
        """Values for JUnit XML (record_property)."""
        values: list[tuple[str, object]] = [("netsim.status", report.status)]
        if report.host_load is not None:
            values.append(("netsim.host_steal", report.host_load.steal))
        for mode, result in report.modes.items():
            values += [(f"netsim.{mode}.iteration_s.median", result.iteration.median),
                       *([(f"netsim.{mode}.comm_s.median", result.comm.median),
                          (f"netsim.{mode}.comm_s.std", result.comm.std)]
                         if result.comm else []),
                       *([(f"netsim.{mode}.collective_s.median", result.collective.median),
                          (f"netsim.{mode}.collective_s.std", result.collective.std)]
                         if result.collective else []),
                       (f"netsim.{mode}.wire_bytes_per_iteration",
                        result.wire_bytes_per_iteration)]
        return values

    @staticmethod
    def sweep_failure_text(sweep) -> str:
        lines = [f"{sweep.scenario.name}: the sweep failed"]
        for point in sweep.points:
            if not point.report.passed:
                lines.append(f"  point {point.label}: "
                             + NetsimSession.failure_text(point.report).replace("\n", "\n  "))
        if sweep.held_out is not None and not sweep.held_out.met:
            lines.append(f"  the cost model missed the held-out points by up to "
                         f"{sweep.held_out.max_abs_error:.1%} (target {sweep.held_out.target:.0%})")
        lines += [f"  note: {note}" for note in sweep.notes]
        return "\n".join(lines)

    @staticmethod
    def failure_text(report: ScenarioReport) -> str:
        if report.error:
            return f"{report.scenario.name}: the run broke: {report.error}"
        lines = [f"{report.scenario.name}: {sum(not c.passed for c in report.checks)} of "
                 f"{len(report.checks)} checks failed"]
        lines += [f"  FAILED {check.name}: {check.detail}"
                  for check in report.checks if not check.passed]
        lines += [f"  passed {check.name}" for check in report.checks if check.passed]
        return "\n".join(lines)


def _recorded(scenario: Scenario, run: Callable[[], ScenarioReport]) -> ScenarioReport:
    """The runner's report, or one that records why the run broke: a crashed rank, a host
    that lacks something, a netlink error, a dead delay line or helper, a scenario this host
    cannot hold. Anything but an interrupt: one broken scenario never loses the others."""
    try:
        check_host(scenario)
        return run()
    except ScenarioError as exc:
        return ScenarioReport(scenario, error=str(exc))
    except Exception as exc:
        # The harness's own errors say what broke; anything else also says what it is.
        known = isinstance(exc, (FabricError, WorkloadError))
        return ScenarioReport(scenario, error=str(exc) if known else
                              f"{type(exc).__name__}: {exc}")


def scenario_folder(out_dir: Path, scenario: Scenario) -> Path:
    """The scenario's folder under --out. Scenario names are validated to be safe folder
    names; this refuses anything that would still leave out_dir."""
    folder = out_dir / scenario.name
    if folder.resolve().parent != out_dir.resolve():
        raise ValueError(f"scenario name {scenario.name!r} does not name a folder inside "
                         f"{out_dir}")
    return folder


def probe_summary(reports: list[ScenarioReport]) -> str:
    """", all-reduce probe 97-100% of the link (1 retried)": how far the runs can be trusted."""
    probes = [report.fidelity for report in reports if report.fidelity is not None]
    if not probes:
        return ""
    low, high = min(p.fraction for p in probes), max(p.fraction for p in probes)
    span = f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low:.0%}-{high:.0%}"
    retried = sum(len(p.attempts_bps) > 1 for p in probes)
    return (f", all-reduce probe {span} of the link"
            + (f" ({retried} retried)" if retried else ""))


def steal_warning(reports: list[ScenarioReport]) -> str | None:
    """A line when the hypervisor took a noticeable share of the CPUs while modes trained:
    comparisons between modes of one run still hold, absolute times (baselines) less so."""
    steal = max_steal(report.host_load for report in reports)
    if steal < STEAL_NOTICEABLE:
        return None
    return (f"warning: the hypervisor took {steal:.0%} of this host's CPU time while training: "
            "modes compared within the run still hold; absolute times (and baselines) reflect "
            "the neighbours too")
