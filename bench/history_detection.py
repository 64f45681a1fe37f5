"""The history gate on synthetic series with known steps: how often it finds them, how often it
cries wolf. No training; minutes of CPU.

    python bench/history_detection.py [--trials 50] [--seed 0]

Noise as this host shows it (README): each run's median moves 0.6-2.1% from run to run
(`default` rerun 11 times), and within a run fp32's iteration and comm times have a standard
deviation of about 3% of their median. Each synthetic run is 20 iterations drawn around its
run's level; a series is n runs with a step of +3%, +5% or +10% (or none).

Two questions, two tables:
- change points: on a series with the step in the middle, is a change point found within one
  run of it (detection), and on a series without a step, is any found (false alarm)?
- the gate (the verdict on the newest run, default 5% tolerance): with n-1 runs at the old
  level and the newest the first on the new level, is it flagged at once (detection), and with
  no step, does the newest run fail (false alarm)?
- and does the gate stay red: with the newest run the 1st, 3rd, 5th or 10th on a level 10%
  worse (none accepted), is the newest run still flagged? The history is replayed run by run,
  so the earlier runs on the new level, regressions when they were the newest, never join the
  reference.
"""

from __future__ import annotations

import argparse
import datetime

import numpy as np

from netsim_ddp.measure.document import SCHEMA_VERSION, parse_document
from netsim_ddp.verdicts.changepoint import segment
from netsim_ddp.verdicts.gate import Metric
from netsim_ddp.verdicts.history import DEFAULT_TOLERANCE, Run, judge_history

WITHIN_CV = 0.03
ITERATIONS = 20
STEPS = (0.0, 0.03, 0.05, 0.10)
LENGTHS = (20, 50)
BETWEEN_CVS = (0.01, 0.02)
LATER = (1, 3, 5, 10)  # the newest run's place on the worse level
METRIC = Metric.parse("iteration_s.median")


def run_levels(rng: np.random.Generator, n: int, step: float, at: int, cv: float) -> np.ndarray:
    levels = np.where(np.arange(n) >= at, 1.0 + step, 1.0)
    return 0.7 * levels * (1 + cv * rng.standard_normal(n))


def as_runs(rng: np.random.Generator, levels: np.ndarray) -> list[Run]:
    start = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    runs = []
    for number, level in enumerate(levels, start=1):
        samples = list(level * (1 + WITHIN_CV * rng.standard_normal(ITERATIONS)))
        mode = {"iteration_s": samples, "comm_s": samples, "compute_s": [0.0] * ITERATIONS,
                "summary": {key: {"median": float(np.median(samples))}
                            for key in ("iteration_s", "comm_s", "compute_s")},
                "scaling_efficiency": 0.0, "wire_bytes_per_iteration": 1.0}
        document = parse_document({
            "version": SCHEMA_VERSION,
            "created_at": (start + datetime.timedelta(hours=number)).isoformat(),
            "scenarios": [{"name": "synthetic", "status": "passed", "modes": {"fp32": mode},
                           "scenario_digest": "s"}]})
        runs.append(Run(number, f"run-{number}", document))
    return runs


def change_points(trials: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    rows = []
    for cv in BETWEEN_CVS:
        for n in LENGTHS:
            for step in STEPS:
                hits = 0
                for _ in range(trials):
                    levels = run_levels(rng, n, step, n // 2, cv)
                    medians = [float(np.median(level * (1 + WITHIN_CV * rng.standard_normal(
                        ITERATIONS)))) for level in levels]
                    found = segment(medians).change_points
                    hits += (any(abs(p.index - n // 2) <= 1 for p in found) if step
                             else bool(found))
                rows.append((cv, n, step, hits / trials))
    return rows


def gate(trials: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed + 1)
    rows = []
    for cv in BETWEEN_CVS:
        for n in LENGTHS:
            for step in STEPS:
                flagged = 0
                for _ in range(trials):
                    runs = as_runs(rng, run_levels(rng, n, step, n - 1, cv))
                    report = judge_history(runs, [METRIC], {METRIC: DEFAULT_TOLERANCE})
                    flagged += not report.passed
                rows.append((cv, n, step, flagged / trials))
    return rows


def stays_red(trials: int, seed: int, step: float = 0.10) -> list[tuple]:
    rng = np.random.default_rng(seed + 2)
    rows = []
    for cv in BETWEEN_CVS:
        for n in LENGTHS:
            for later in LATER:
                flagged = 0
                for _ in range(trials):
                    runs = as_runs(rng, run_levels(rng, n, step, n - later, cv))
                    report = judge_history(runs, [METRIC], {METRIC: DEFAULT_TOLERANCE})
                    flagged += not report.passed
                rows.append((cv, n, later, flagged / trials))
    return rows


def later_table(rows: list[tuple]) -> None:
    print("\ngate, a +10% step, the newest run the k-th on the new level (flagged)")
    print("| run-to-run CV | runs | " + " | ".join(f"k = {k}" for k in LATER) + " |")
    print("|---|---|" + "---|" * len(LATER))
    for cv in BETWEEN_CVS:
        for n in LENGTHS:
            cells = {k: rate for c, length, k, rate in rows if c == cv and length == n}
            print(f"| {cv:.0%} | {n} | " + " | ".join(f"{cells[k]:.0%}" for k in LATER) + " |")


def table(title: str, rows: list[tuple], hit: str, alarm: str) -> None:
    print(f"\n{title}")
    print(f"| run-to-run CV | runs | {alarm} (no step) | " +
          " | ".join(f"{hit} +{step:.0%}" for step in STEPS[1:]) + " |")
    print("|---|---|---|" + "---|" * (len(STEPS) - 1))
    for cv in BETWEEN_CVS:
        for n in LENGTHS:
            cells = {step: rate for c, length, step, rate in rows if c == cv and length == n}
            print(f"| {cv:.0%} | {n} | {cells[0.0]:.0%} | "
                  + " | ".join(f"{cells[step]:.0%}" for step in STEPS[1:]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.trials} series per cell; {ITERATIONS} iterations per run, within-run CV "
          f"{WITHIN_CV:.0%}; gate tolerance {DEFAULT_TOLERANCE:.0%}")
    table("change points (step in the middle; found within one run of it)",
          change_points(args.trials, args.seed), "found", "false alarms")
    table("gate (the newest run is the first after the step; flagged at once)",
          gate(args.trials, args.seed), "flagged", "false failures")
    later_table(stays_red(args.trials, args.seed))


if __name__ == "__main__":
    main()
