"""Commands over results already written: report, history, export, and calibrate (nccl-tests
output of a target cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from netsim_ddp.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    NIC_RATE_HELP,
    NICS_HELP,
    FiniteFloat,
    RateParam,
    err,
    fail_command,
    human_console,
    main,
    out,
    write_json,
)
from netsim_ddp.report.command_tables import calibration_table
from netsim_ddp.scenario.units import format_size


@main.command("report")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="report", show_default=True,
              type=click.Path(file_okay=False), help="Folder for the PNGs and the report.")
@click.option("--calibration", metavar="FILE", type=click.Path(dir_okay=False), multiple=True,
              help="nccl-tests output of the target cluster (repeat for a one-server run): "
                   "project each sweep again from it.")
@click.option("--nics-per-server", type=click.IntRange(min=1), default=None, help=NICS_HELP)
@click.option("--nic-bandwidth", "nic_bandwidth", type=RateParam(), default=None,
              help=NIC_RATE_HELP)
@click.option("--history", "history_paths", multiple=True, type=click.Path(exists=True),
              metavar="PATH", help="Earlier results files (or folders of them): add each "
                                   "metric's history, its change points and verdict "
                                   "(repeatable; RESULTS is the newest run).")
def report_command(results: str, out_dir: str, calibration: tuple[str, ...],
                   nics_per_server: int | None, nic_bandwidth: float | None,
                   history_paths: tuple[str, ...]) -> None:
    """Plots (PNG) and a Markdown/HTML report from `netsim-ddp run --json` results."""
    from netsim_ddp.measure.record import DocumentError
    from netsim_ddp.projection.calibrate import CalibrationError
    from netsim_ddp.projection.nccl_tests import NcclParseError
    from netsim_ddp.report.plots import report
    from netsim_ddp.verdicts.history import HistoryError, judge_history, load_runs, runs_in

    judged = None
    if history_paths:
        paths = [path for given in history_paths
                 for path in (runs_in(given) if Path(given).is_dir() else [Path(given)])]
        paths = [path for path in paths if path.resolve() != Path(results).resolve()]
        try:
            runs, notes = load_runs([*paths, results])
        except HistoryError as exc:
            fail_command(f"--history: {exc}", EXIT_BAD_INPUT)
        judged = judge_history(runs)
        judged.notes[:0] = notes
    try:
        if not calibration and (nics_per_server is not None or nic_bandwidth is not None):
            fail_command("--nics-per-server/--nic-bandwidth describe a --calibration's servers: "
                         "give the calibration too", EXIT_BAD_INPUT)
        path = report(results, out_dir, calibration=list(calibration) or None, history=judged,
                      nics_per_server=nics_per_server, nic_bandwidth_bps=nic_bandwidth)
    except (CalibrationError, NcclParseError) as exc:
        fail_command(f"--calibration: {exc}", EXIT_BAD_INPUT)
    except DocumentError as exc:
        fail_command(f"not a netsim-ddp results file: {exc}", EXIT_BAD_INPUT)
    out.print(f"wrote {path} (and {path.with_suffix('.html').name}, PNGs) in {out_dir}")


@main.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--metric", "metrics", multiple=True, metavar="METRIC",
              help="A metric to follow, e.g. comm_s.p95 (repeatable; default: iteration and "
                   "comm medians, scaling efficiency, wire bytes).")
@click.option("--tolerance", "tolerances", multiple=True, metavar="METRIC:PCT",
              help="How much worse than the best earlier level the newest run may be, e.g. "
                   "median:5% (repeatable; default 5% for each metric).")
@click.option("--alpha", type=FiniteFloat(), default=0.05, show_default=True,
              help="Significance level of change points and regressions.")
@click.option("--as-given", is_flag=True,
              help="Judge the runs in the order given, not by their recorded times.")
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the verdicts and change points as JSON ('-': stdout).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write a plot per series and metric, and history.md/.html, here.")
@click.option("--accept", "accepted", metavar="RUN",
              help="Acknowledge RUN (its number as listed, or its results file) as an intended "
                   "change: it and the regressions right before it become the reference. "
                   "Saved in its folder's netsim-ddp-accepted.jsonl.")
def history(results: tuple[str, ...], metrics: tuple[str, ...], tolerances: tuple[str, ...],
            alpha: float, as_given: bool, json_out: str | None, out_dir: str | None,
            accepted: str | None) -> None:
    """Change points in the history of earlier runs (`run --json` files, or folders of
    them), and a verdict on the newest run; exit 1 if it regressed."""
    from netsim_ddp.report.ci import append_step_summary, change_text, history_summary
    from netsim_ddp.verdicts.history import (
        HistoryError,
        accept,
        judge_history,
        load_runs,
        parse_metrics,
        runs_in,
    )

    if not 0 < alpha < 1:
        fail_command(f"--alpha must be between 0 and 1, got {alpha}", EXIT_BAD_INPUT)
    paths = [path for given in results
             for path in (runs_in(given) if Path(given).is_dir() else [Path(given)])]
    try:
        chosen, fractions = parse_metrics(metrics, tolerances)
        runs, notes = load_runs(paths, by_time=not as_given)
        if accepted is not None:
            runs, marker = accept(runs, accepted)
            err.print(f"accepted {accepted}: recorded in {marker}")
    except (HistoryError, OSError) as exc:
        fail_command(str(exc), EXIT_BAD_INPUT)
    report = judge_history(runs, chosen, fractions, alpha)
    report.notes[:0] = notes
    human = human_console(json_out)
    human.print(f"{len(runs)} runs: " + ", ".join(f"{run.number} {run.source}"
                                                  for run in runs), soft_wrap=True)
    for note in report.notes:
        human.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    for item in sorted(report.metrics, key=lambda h: (h.key.label, str(h.metric))):
        for point in item.segmentation.change_points:
            human.print(f"  change {escape(change_text(item, point))}", soft_wrap=True)
        verdict = item.verdict
        if verdict is None:
            human.print(f"  - {item.key.label} {item.metric}: {len(item.values)} run(s), "
                        "nothing to compare yet")
        elif not item.gating:
            human.print(f"  - {escape(verdict.detail)} (an older series: not gated)",
                        soft_wrap=True)
        else:
            mark = "[green]ok[/]" if verdict.passed else "[red]FAILED[/]"
            human.print(f"  {mark} {escape(verdict.detail)}", soft_wrap=True)
    if out_dir is not None:
        from netsim_ddp.report.plots import history_report

        path = history_report(report, out_dir)
        err.print(f"wrote {path} (and {path.with_suffix('.html').name}, PNGs) in {out_dir}")
    append_step_summary(history_summary(report))
    write_json(json_out, report.as_dict())
    sys.exit(EXIT_OK if report.passed else EXIT_FAILED)


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "kind", default="github-action-benchmark", show_default=True,
              type=click.Choice(["github-action-benchmark", "github-action-benchmark-bigger",
                                 "bencher"]),
              help="github-action-benchmark's customSmallerIsBetter (times, bytes) or "
                   "customBiggerIsBetter (-bigger: scaling efficiency), or Bencher Metric "
                   "Format.")
@click.option("--out", "out_file", default="-", show_default=True, metavar="FILE",
              help="Where to write it ('-': stdout).")
def export(results: str, kind: str, out_file: str) -> None:
    """The results of `run --json` in a benchmark-tracking service's format."""
    from netsim_ddp.measure.document import load_document
    from netsim_ddp.measure.record import DocumentError
    from netsim_ddp.report.ci import bencher_metrics, github_benchmark

    try:
        document = load_document(results)
    except DocumentError as exc:
        fail_command(f"not a netsim-ddp results file: {exc}", EXIT_BAD_INPUT)
    data = (bencher_metrics(document) if kind == "bencher"
            else github_benchmark(document, bigger_is_better=kind.endswith("-bigger")))
    write_json(out_file, data)  # type: ignore[arg-type]


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the calibration as JSON ('-': stdout).")
@click.option("--collective", type=click.Choice(["all_reduce", "reduce_scatter", "all_gather"]),
              help="For output that does not say which test ran.")
@click.option("--nics-per-server", type=click.IntRange(min=1), default=None, help=NICS_HELP)
@click.option("--nic-bandwidth", "nic_bandwidth", type=RateParam(), default=None,
              help=NIC_RATE_HELP)
def calibrate(files: tuple[str, ...], json_out: str | None, collective: str | None,
              nics_per_server: int | None, nic_bandwidth: float | None) -> None:
    """Fit NCCL's cost model (a latency and a bandwidth per algorithm/protocol regime) to
    nccl-tests output (as printed or pasted, or its -J JSON); print per size the measured time
    and the held-out error (the model fitted without that size, predicting it), each file
    predicted from the others when several are given, and whether a multi-host all_reduce can
    be extrapolated to more hosts."""
    from netsim_ddp.projection.calibrate import (
        ERROR_FROM_BYTES,
        CalibrationError,
        held_out_document,
        load,
        projection_use,
        regime_lines,
    )
    from netsim_ddp.projection.cluster import check_network, nics_of
    from netsim_ddp.projection.held_out_files import held_out_file_lines, leave_one_file_out
    from netsim_ddp.projection.nccl_tests import CALIBRATABLE, NcclParseError

    try:
        found = load(files, collective)
    except (CalibrationError, NcclParseError) as exc:
        fail_command(str(exc), EXIT_BAD_INPUT)
    human = human_console(json_out)
    documents = []
    for calibration in found:
        document = held_out_document(calibration)
        documents.append(document)
        human.print(calibration_table(calibration.label, document))
        for note in calibration.dropped:
            human.print(f"[yellow]{escape(note)}[/]")
        for line_text in regime_lines(calibration):
            human.print(line_text)
        line = document["alpha_beta_line"]
        held = document["max_abs_held_out_error_from_1MiB"]
        if any(row["size"] >= ERROR_FROM_BYTES for row in document["sizes"]):
            human.print(f"from {format_size(ERROR_FROM_BYTES)} up: max |held-out error| "
                        + (f"{held:.1%}" if held is not None else "- (too few sizes)"))
        human.print(f"busbw plateau {document['busbw_bytes_per_s'] / 1e9:.2f} GB/s; one "
                    f"alpha-beta line (alpha {line['alpha_s'] * 1e6:.1f} us) would miss by up "
                    f"to {line['max_abs_error']:.0%}")
        if calibration.hosts > 1 and calibration.collective == "all_reduce":
            try:
                nics = nics_of(calibration, nics_per_server=nics_per_server,
                               nic_bandwidth_bps=nic_bandwidth, where="--calibration")
            except CalibrationError as exc:
                fail_command(str(exc), EXIT_BAD_INPUT)
            check = check_network(calibration, nics)
            document["network_check"] = {"nics": nics.as_dict(), "tree": check.tree,
                                         "ring_scale": check.ring_scale,
                                         "flags": list(check.flags),
                                         "notes": list(check.notes)}
            for flag in check.flags:
                human.print(f"[bold red]{escape(flag)}[/]")
            for note in check.notes:
                human.print(f"[yellow]note: {escape(note)}[/]")
        human.print(f"[yellow]{escape(projection_use(calibration, CALIBRATABLE))}[/]")
    try:
        held_files = leave_one_file_out(found, nics_per_server=nics_per_server,
                                        nic_bandwidth_bps=nic_bandwidth)
    except CalibrationError as exc:
        fail_command(str(exc), EXIT_BAD_INPUT)
    for line_text in held_out_file_lines(held_files):
        human.print(escape(line_text))
    write_json(json_out, {"calibrations": documents,
                          "leave_one_file_out": [h.as_dict() for h in held_files]})
