"""Benchmark: does amp-fp16 cut the spread of the gradient collectives against fp32, significantly,
run after run?

Runs each scenario `--runs` times through `netsim-ddp run --json` (every run with its own --out
folder), then judges each run with the claim a scenario would ship:

    [[expect]]
    metric = "collective_s.std"
    mode = "amp-fp16"
    vs = "fp32"
    max_ratio = 1.0

through the gate itself (`gate.evaluate`: the ratio of standard deviations, and a one-sided
Mann-Whitney test on absolute deviations from the median). Prints a table per scenario, one row
per run (fp32 and amp-fp16 collective_s sd, their ratio, the p-value, held or not, the run's
status and wall time) and how many of the runs held. It trains: run it under the heavy-work lock.

    flock /tmp/nsd-heavy.lock .venv/bin/python bench/variance_claim.py \
        scenarios/network-jitter.toml scenarios/contended.toml --runs 10 --out /tmp/variance
    # judge the runs already in --out again, without training
    .venv/bin/python bench/variance_claim.py scenarios/network-jitter.toml --out /tmp/variance \
        --no-run
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from netsim_ddp import Scenario
from netsim_ddp.measure.document import ScenarioRecord, load_document
from netsim_ddp.measure.record import DocumentError
from netsim_ddp.scenario.expectations import Expectation
from netsim_ddp.verdicts.gate import Metric, evaluate

CLAIM = Expectation(metric="collective_s.std", mode="amp-fp16", vs="fp32", max_ratio=1.0)
# The command beside this interpreter (a venv's), else the one on PATH.
NETSIM = [shutil.which("netsim-ddp", path=str(Path(sys.executable).parent)) or "netsim-ddp"]


@dataclass(frozen=True)
class RunVerdict:
    run: int
    status: str
    wall_s: float | None
    fp32_sd_s: float | None = None
    amp_fp16_sd_s: float | None = None
    ratio: float | None = None
    p_value: float | None = None
    held: bool = False
    detail: str = ""


def run_once(scenario: Path, json_path: Path, out_dir: Path, iterations: int | None) -> float:
    """One `netsim-ddp run`; its exit status is the scenario's verdict, judged from the JSON."""
    command = [*NETSIM, "run", str(scenario), "--json", str(json_path), "--out", str(out_dir)]
    if iterations is not None:
        command += ["--iterations", str(iterations)]
    began = time.monotonic()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def judge(index: int, json_path: Path, wall_s: float | None) -> RunVerdict:
    try:
        record: ScenarioRecord = load_document(json_path).scenarios[0]
    except (DocumentError, IndexError) as exc:
        return RunVerdict(index, "no result", wall_s, detail=str(exc))
    missing = [mode for mode in (CLAIM.mode, CLAIM.vs) if mode not in record.modes]
    if missing:
        reason = record.refused or record.error or f"modes missing: {', '.join(missing)}"
        return RunVerdict(index, record.status, wall_s, detail=reason)
    assert CLAIM.vs is not None
    metric = Metric.parse(CLAIM.metric)
    verdict = evaluate(CLAIM, record.modes)  # type: ignore[arg-type]  # records read the same
    fp32, amp = metric.value(record.modes[CLAIM.vs]), metric.value(record.modes[CLAIM.mode])
    return RunVerdict(index, record.status, wall_s, fp32, amp, amp / fp32 if fp32 else None,
                      verdict.p_value, verdict.passed, verdict.detail)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def table(name: str, verdicts: list[RunVerdict]) -> Table:
    held = sum(v.held for v in verdicts)
    result = Table(title=f"{name}: amp-fp16 collective_s.std <= fp32's, significantly "
                         f"(alpha {CLAIM.alpha:g}): held in {held}/{len(verdicts)} runs")
    for column in ("run", "fp32 sd", "amp-fp16 sd", "ratio", "p", "claim", "run status",
                   "wall"):
        result.add_column(column, justify="right")
    for v in verdicts:
        result.add_row(str(v.run), ms(v.fp32_sd_s), ms(v.amp_fp16_sd_s),
                       "-" if v.ratio is None else f"{v.ratio:.2f}",
                       "-" if v.p_value is None else f"{v.p_value:.2g}",
                       "[green]held[/]" if v.held else "[red]not held[/]", v.status,
                       "-" if v.wall_s is None else f"{v.wall_s:.0f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--iterations", type=int, help="Override the scenarios' iterations.")
    parser.add_argument("--out", type=Path, required=True,
                        help="Each run's JSON and folder go under OUT/<scenario>/.")
    parser.add_argument("--no-run", action="store_true",
                        help="Judge the runs already under --out; train nothing.")
    args = parser.parse_args()
    console = Console()
    summary = {}
    for path in args.scenarios:
        name = Scenario.load(path).name  # a bad file fails before anything trains
        folder = args.out / name
        verdicts = []
        for index in range(1, args.runs + 1):
            json_path = folder / f"run-{index:02d}.json"
            wall_s = None
            if not args.no_run:
                console.print(f"  {name} run {index}/{args.runs}", highlight=False)
                json_path.unlink(missing_ok=True)  # a failed run must not judge an older one
                wall_s = run_once(path, json_path, folder / f"run-{index:02d}", args.iterations)
            elif not json_path.exists():
                break
            verdicts.append(judge(index, json_path, wall_s))
        console.print(table(name, verdicts))
        for v in verdicts:
            if not v.held:
                console.print(f"  run {v.run}: {v.detail}", highlight=False, soft_wrap=True)
        summary[name] = {"held": sum(v.held for v in verdicts), "runs": len(verdicts),
                         "per_run": [asdict(v) for v in verdicts]}
    if not args.no_run:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "variance_claim.json").write_text(json.dumps(
            {"benchmark": "variance_claim", "claim": CLAIM.model_dump(exclude_none=True),
             "scenarios": summary}, indent=2))


if __name__ == "__main__":
    main()
