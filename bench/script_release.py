"""Benchmark: a script release gated at scale. A user's plain DDP script
(tests/scripts/tiny_train.py, 4.2M parameters) in a scale model, three launches in one
session: the release you trust (its baseline saved), the same release again, and one that
all-reduces 10% more floats each step (`--stats-floats`, a "logging" all-reduce). The baseline
gate (wire bytes per step, 5%) must pass the second and flag the third.

    python bench/script_release.py [--scenario scenarios/scale/10gbe-16gpu.toml] [--json OUT]

Prints, per launch, status, wire MB per step, its ratio to the baseline, the step's median in
target time and the gate's verdict. Minutes at 16 GPUs: run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "tiny_train.py"
ARGS = ["--width", "1024", "--layers", "4", "--steps", "8"]
PARAMS = 4 * (1024 * 1024 + 1024)  # the MLP's four layers: weights and biases


def launch(scenario: Path, out: Path, name: str, *extra: str) -> dict:
    results = out / f"{name}.json"
    argv = [sys.executable, "-m", "netsim_ddp.cli", "launch", str(scenario), "--out",
            str(out / name), "--json", str(results), *extra, "--", str(SCRIPT), *ARGS]
    if name == "more":
        argv += ["--stats-floats", str(PARAMS // 10)]
    done = subprocess.run(argv, text=True, capture_output=True)
    print(done.stdout[-3000:], done.stderr[-2000:], sep="\n", flush=True)
    (report,) = json.loads(results.read_text())["scenarios"]
    report["returncode"] = done.returncode
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path,
                        default=ROOT / "scenarios" / "scale" / "10gbe-16gpu.toml")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="netsim-ddp-release-"))
    baseline = out / "baseline.json"
    gate = ["--baseline", str(baseline), "--tolerance", "wire_bytes_per_iteration:5%"]
    runs = {"trusted": launch(args.scenario, out, "trusted", "--save-baseline", str(baseline)),
            "same": launch(args.scenario, out, "same", *gate),
            "more": launch(args.scenario, out, "more", *gate)}
    first = runs["trusted"]["modes"]["script"]["wire_bytes_per_iteration"]
    table = Table(title=f"a script release gated in {args.scenario.name} (times: target's)")
    for column in ("launch", "status", "probe", "wire MB/step", "vs trusted", "step ms",
                   "baseline gate"):
        table.add_column(column)
    for name, report in runs.items():
        mode = report["modes"]["script"]
        gates = [c for c in report["checks"] if c["name"].startswith("baseline:")]
        failed = [c["name"].split(":")[-1] for c in gates if not c["passed"]]
        verdict = ("-" if not gates else "flagged: " + ", ".join(failed) if failed else "passed")
        probe = report.get("fidelity") or {}
        table.add_row(name, report["status"], f"{probe.get('fraction', float('nan')):.0%}",
                      f"{mode['wire_bytes_per_iteration'] / 1e6:.1f}",
                      f"{mode['wire_bytes_per_iteration'] / first:.3f}",
                      f"{statistics.median(mode['iteration_s']) * 1e3:.1f}", verdict)
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
