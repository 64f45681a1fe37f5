"""Benchmark: run the shipped sweep, fit the DDP step cost model on the smaller points, and
report how well it predicts the held-out (largest) point (target: within 15% of the measured
step time), the fitted parameters, and the projection; writes the JSON and the report.

    python bench/costmodel.py [scenarios/sweep.toml] [--json OUT] [--report DIR] [--iterations N]
    python bench/costmodel.py --from-json OUT    # re-analyse and re-plot a saved sweep
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from netsim_ddp import Scenario
from netsim_ddp.fabric.namespaces.privilege import ensure_network_privilege
from netsim_ddp.measure.document import SweepRecord, load_document, save
from netsim_ddp.run.sweep import run_sweep
from netsim_ddp.verdicts.scenario_report import results_document

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "sweep.toml"))
    parser.add_argument("--json", default="sweep-results.json")
    parser.add_argument("--report", default="sweep-report")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--from-json", default=None)
    args = parser.parse_args()

    if args.from_json:
        document = load_document(args.from_json)
        json_path = Path(args.from_json)
    else:
        ensure_network_privilege(restart=True)  # rootless: before it does anything
        scenario = Scenario.load(args.scenario)
        config = scenario.sweep
        started = time.monotonic()
        sweep = run_sweep(scenario, config, iterations=args.iterations,
                          progress=lambda message: print(f"  {message}", flush=True))
        print(f"sweep ran in {time.monotonic() - started:.0f} s "
              f"({', '.join(f'{p.seconds:.0f} s' for p in sweep.points)} per point)")
        document = results_document([], [sweep])
        json_path = save(document, args.json)
    for entry in document.sweeps:
        print_sweep(entry)
    from netsim_ddp.report.plots import report

    index = report(json_path, args.report)
    print(f"report: {index}")


def print_sweep(entry: SweepRecord) -> None:
    print(f"\n{entry.name}: measured points (medians)")
    print(f"  {'point':<18}{'mode':<10}{'step ms':>9}{'compute':>9}{'comm':>8}{'eff':>6}"
          f"{'samples/s':>11}")
    for point in entry.points:
        for mode, m in point.modes.items():
            print(f"  {point.label:<18}{mode:<10}{m.step_s * 1e3:9.1f}"
                  f"{m.compute_s * 1e3:9.1f}{m.comm_s * 1e3:8.1f}"
                  f"{m.scaling_efficiency:6.2f}{m.throughput_samples_s:11.0f}")
    held_out = entry.held_out
    if held_out:
        fitted = held_out.fit.model
        print(f"\nheld-out check: fitted on the smaller points: alpha "
              f"{fitted.alpha_s * 1e3:.2f} ms, bandwidth {fitted.bandwidth_efficiency:.0%} "
              f"of link, overlap {fitted.overlap:.2f}")
        for held in held_out.held_out:
            print(f"  {held.label:<18}{held.mode:<10} measured "
                  f"{(held.step_s or 0) * 1e3:7.1f} ms, predicted {held.predicted_s * 1e3:7.1f}"
                  f" ms, error {held.error:+.1%}")
        verdict = "within" if held_out.within_target else "OUTSIDE"
        print(f"  max |error| {held_out.max_abs_error:.1%}: {verdict} the "
              f"{held_out.target:.0%} target")
    if entry.fit:
        model = entry.fit.model
        print(f"\nmodel on all points: alpha {model.alpha_s * 1e3:.2f} ms, bandwidth "
              f"{model.bandwidth_efficiency:.0%} of link, overlap {model.overlap:.2f} "
              f"(rms error {entry.fit.rms_relative_error:.1%}, condition "
              f"{entry.fit.condition:.0f})")
    projection = entry.projection
    if projection:
        print(f"\n{projection.label}")
        rates = sorted({row.link_bps for row in projection.rows})
        gpus = sorted({row.gpus for row in projection.rows})
        print(f"  {'mode':<10}{'GbE':>5}" + "".join(f"{n:>8}" for n in gpus))
        for mode in projection.compute_s:
            for rate in rates:
                cells = {row.gpus: row.efficiency for row in projection.rows
                         if row.mode == mode and row.link_bps == rate}
                print(f"  {mode:<10}{rate / 1e9:5.0f}" + "".join(f"{cells[n]:8.2f}" for n in gpus))
    for note in entry.notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
