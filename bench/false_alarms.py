"""Benchmark: how often does each gate cry wolf on an unchanged release, and how small a real
regression does it still catch at that rate?

Runs a scenario once as the baseline, then `--runs` more times unchanged, each judged as CI
would judge it: by the run's own checks (claims, wire bytes), against the baseline (the
documented default tolerance, median:10%, alpha 0.05), and against the history of the runs
before it (the history gate's defaults). Then `--slowed-runs` runs per `--slowdowns` with the
links slowed by that much (rate / (1 + s): every byte takes s longer), judged the same way.
Every outcome is one of the four (docs/verdicts.md): a gate's `failed` on an unchanged run is
a false alarm; `untrusted` is the host saying it could not emulate the run, never a verdict.

    python bench/false_alarms.py [--scenario scenarios/default.toml] [--runs 20]
        [--slowdowns 5,10,20] [--slowed-runs 5] [--iterations N] [--neighbour] [--json OUT]

--neighbour runs it beside a bursty CPU neighbour (bench/cpu_neighbour.py: busy 30 ms of every
100 ms on one core), as a shared CI runner's other tenants are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from netsim_ddp import Scenario
from netsim_ddp.fabric import ensure_network_privilege
from netsim_ddp.measure.document import save
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.run.session import DEFAULT_TOLERANCES
from netsim_ddp.verdicts.baseline import Baseline
from netsim_ddp.verdicts.baseline import save as save_baseline
from netsim_ddp.verdicts.gate import Tolerance
from netsim_ddp.verdicts.history import judge_history, load_runs
from netsim_ddp.verdicts.scenario_report import ScenarioReport, results_document

sys.path.insert(0, str(Path(__file__).parent))
from cpu_neighbour import cpu_neighbour  # noqa: E402

GATES = ("run", "baseline", "history")
ALPHA = 0.05


def slowed(scenario: Scenario, slowdown: float) -> Scenario:
    link = scenario.link.model_copy(update={"rate": scenario.link.rate / (1 + slowdown)})
    return scenario.model_copy(update={"link": link})


class Judge:
    """Each run as CI judges it: its own checks, the baseline gate, the history gate."""

    def __init__(self, baseline: ScenarioReport, folder: Path):
        self.folder = folder
        self.baseline = Baseline(save_baseline([baseline], folder / "baseline.json"))
        self.tolerances = [Tolerance.parse(text) for text in DEFAULT_TOLERANCES]
        self.history: list[Path] = []
        self.add(baseline)

    def add(self, report: ScenarioReport) -> Path:
        path = save(results_document([report]), self.folder / f"run{len(self.history):03d}.json")
        self.history.append(path)
        return path

    def outcomes(self, report: ScenarioReport, keep: bool) -> dict[str, str]:
        """Per gate: passed, failed, untrusted (the host: nothing judged) or "not judged" (the
        history too short); `keep` adds the run to the history the next runs are judged by."""
        if report.status in ("untrusted", "error"):
            return dict.fromkeys(GATES, report.status)
        gated = self.baseline.compare(report, self.tolerances, ALPHA)
        path = self.add(report)
        runs, _ = load_runs(self.history)
        history = judge_history(runs)
        if not keep:
            self.history.remove(path)
        judged = history.verdicts
        return {"run": report.status,
                "baseline": "passed" if all(v.passed for v in gated) else "failed",
                "history": ("not judged" if not judged else
                            "passed" if all(v.passed for v in judged) else "failed")}


def commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, cwd=Path(__file__).parent)
    return found.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="scenarios/default.toml")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slowdowns", default="5,10,20", help="percent, comma-separated")
    parser.add_argument("--slowed-runs", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--neighbour", action="store_true")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    ensure_network_privilege(restart=True)  # rootless: before it does anything
    console = Console()
    scenario = Scenario.load(args.scenario)
    slowdowns = [float(s) / 100 for s in args.slowdowns.split(",") if s]
    started = time.monotonic()

    def run(which: Scenario, label: str) -> ScenarioReport:
        report = run_scenario(which, iterations=args.iterations)
        console.print(f"  {label}: {report.status}" + (f" ({report.untrusted_reason})"
                                                       if report.status == "untrusted" else ""),
                      highlight=False)
        return report

    neighbour = cpu_neighbour() if args.neighbour else contextlib.nullcontext()
    unchanged: list[dict[str, str]] = []
    caught: dict[float, list[dict[str, str]]] = {s: [] for s in slowdowns}
    with tempfile.TemporaryDirectory() as folder, neighbour:
        judge = Judge(run(scenario, "baseline"), Path(folder))
        for index in range(args.runs):
            unchanged.append(judge.outcomes(run(scenario, f"unchanged {index + 1}"), keep=True))
        for slowdown in slowdowns:
            for index in range(args.slowed_runs):
                report = run(slowed(scenario, slowdown), f"{slowdown:.0%} slower {index + 1}")
                caught[slowdown].append(judge.outcomes(report, keep=False))

    where = "beside a bursty CPU neighbour" if args.neighbour else "on a quiet host"
    table = Table(title=f"{scenario.name}: {args.runs} unchanged runs {where}, per gate "
                        "(failed = a false alarm)")
    for column in ("gate", "passed", "failed", "untrusted", "not judged"):
        table.add_column(column, justify="right")
    rates = {}
    for gate in GATES:
        counts = Counter(outcome[gate] for outcome in unchanged)
        rates[gate] = dict(counts)
        table.add_row(gate, *(f"{counts[o]}/{len(unchanged)}"
                              for o in ("passed", "failed", "untrusted", "not judged")))
    console.print(table)
    detection = Table(title="the same gates on slowed links (failed = caught)")
    for column in ("slowdown", *GATES[1:]):
        detection.add_column(column, justify="right")
    detected = {}
    for slowdown, outcomes in caught.items():
        counts = {gate: sum(o[gate] == "failed" for o in outcomes) for gate in GATES[1:]}
        detected[f"{slowdown:.0%}"] = counts
        detection.add_row(f"{slowdown:.0%}", *(f"{counts[g]}/{len(outcomes)}" for g in GATES[1:]))
    console.print(detection)
    console.print(f"{time.monotonic() - started:.0f} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "benchmark": "false_alarms", "command": " ".join(sys.argv), "commit": commit(),
            "scenario": scenario.name, "runs": args.runs, "neighbour": args.neighbour,
            "unchanged": rates, "slowed_runs": args.slowed_runs, "detected": detected,
            "outcomes": {"unchanged": unchanged,
                         "slowed": {f"{s:.0%}": o for s, o in caught.items()}},
            "seconds": round(time.monotonic() - started)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
