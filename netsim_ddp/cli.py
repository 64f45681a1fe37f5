"""`netsim-ddp`: the command line. Exit codes: 0 ok, 1 a check failed, 2 bad input."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .scenario import Scenario, ScenarioError
from .units import format_duration, format_rate, format_size

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

# Logs (CI, files) are not terminals: give tables room rather than rich's default 80 columns.
_LOG_WIDTH = 120
out = Console(highlight=False, width=None if sys.stdout.isatty() else _LOG_WIDTH)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else _LOG_WIDTH)


def _fail(message: str, code: int) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    sys.exit(code)


def _load_all(paths: tuple[str, ...]) -> list[Scenario]:
    """Every scenario, validated and checked against what this host can hold (every point of
    a sweep too), before anything is built: the first bad one ends the command."""
    from .limits import HostResources, check_host

    host = HostResources.probe()
    scenarios = []
    for path in paths:
        try:
            scenario = Scenario.load(path)
            check_host(scenario, host)
        except ScenarioError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        scenarios.append(scenario)
    return scenarios


class FiniteFloat(click.ParamType):
    """A float that is a real number (click's FLOAT takes 'nan' and 'inf'), optionally > 0."""

    name = "float"

    def __init__(self, positive: bool = False):
        self.positive = positive

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.positive and number <= 0:
            self.fail(f"{value!r} must be greater than 0", param, ctx)
        return number


def _human(json_out: str | None) -> Console:
    """Where tables go: stderr when stdout carries the JSON, so `--json -` stays parseable."""
    return err if json_out == "-" else out


def _write_json(target: str | None, document: dict, quiet: bool = False) -> None:
    if target is None:
        return
    text = json.dumps(document, indent=2)
    if target == "-":
        click.echo(text)
        return
    path = Path(target)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text + "\n")
    temporary.replace(path)  # never a half-written results file
    if not quiet:
        err.print(f"wrote {target}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netsim-ddp")
def main() -> None:
    """Emulate a cluster network on this host and test DDP training on it."""


@main.command()
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the result as JSON ('-': stdout).")
def check(json_out: str | None) -> None:
    """Print what this host can emulate; exit 1 if it can build nothing."""
    from .fabric.capabilities import probe_capabilities, torch_status

    caps = probe_capabilities()  # first: a rootless run must unshare before any thread starts
    torch_info = torch_status()
    table = Table(title="netsim-ddp check", show_header=True)
    table.add_column("capability")
    table.add_column("status")
    table.add_column("used for")
    rows = [
        ("privilege", caps.privilege, "root, or rootless through a user namespace"),
        ("network namespaces", caps.namespaces, "one per emulated node"),
        ("veth", caps.veth, "node NICs"),
        ("bridge", caps.bridge, "the switch"),
        ("tbf qdisc", caps.tbf, "rate limits"),
        ("htb qdisc", caps.htb, "(optional) class-based shaping"),
        ("netem qdisc", caps.netem, "delay, jitter, loss (in the kernel)"),
        ("delay line", caps.delay_line, "delay, jitter, loss where netem is missing"),
        ("ifb", caps.ifb, "(optional) ingress shaping"),
        ("clsact", caps.clsact, "(optional) classifiers"),
        ("torch", torch_info["torch"] or False, "DDP workloads"),
        ("gloo", torch_info["gloo"], "CPU collectives"),
        ("nccl + GPUs", torch_info["nccl"], f"GPU collectives ({torch_info['cuda_devices']} GPUs)"),
    ]
    for name, status, use in rows:
        shown = ("[green]yes[/]" if status is True else "[red]no[/]" if status is False
                 else str(status))
        table.add_row(name, shown, use)
    _human(json_out).print(table)
    if caps.error:
        err.print(f"[red]{escape(caps.error)}[/]")
    if not caps.netem and caps.can_build:
        _human(json_out).print(
            "netem is missing: delay, jitter and loss run through the userspace delay line"
            if caps.delay_line else
            f"netem is missing and the delay line cannot be built ({caps.delay_line_error}): "
            "scenarios with delay, jitter or loss cannot run here")
    _write_json(json_out, {"capabilities": caps.as_dict(), "torch": torch_info})
    sys.exit(EXIT_OK if caps.can_build else EXIT_FAILED)


@main.command()
@click.argument("files", nargs=-1, required=True)
def validate(files: tuple[str, ...]) -> None:
    """Check scenario files (every sweep point, and against what this host can hold) without
    building anything; exit 2 on the first bad one."""
    for scenario in _load_all(files):
        link = scenario.link
        points = (f", {len(scenario.sweep.points())} sweep points checked"
                  if scenario.sweep is not None else "")
        out.print(f"ok: {scenario.path} ({scenario.name}: {scenario.topology.nodes} nodes x "
                  f"{scenario.topology.ranks_per_node} ranks at {format_rate(link.rate)}"
                  f"{points})")


@main.command()
def schema() -> None:
    """Print the JSON Schema of scenario files (for editors)."""
    click.echo(Scenario.json_schema())


@main.command()
@click.argument("file")
def plan(file: str) -> None:
    """Show the network a scenario builds, without building it."""
    import ipaddress

    from .fabric import FabricError
    from .fabric.capabilities import probe_capabilities
    from .fabric.plan import plan_fabric

    (scenario,) = _load_all((file,))
    subnet = scenario.topology.subnet or ipaddress.IPv4Network("10.128.0.0/24")
    impaired = any(scenario.link_for(i).impaired for i in range(scenario.topology.nodes))
    try:  # which delay backend applies depends on this host's kernel
        fabric_plan = plan_fabric(scenario, "000000", subnet,
                                  impaired and probe_capabilities().netem)
    except FabricError as exc:
        _fail(f"{scenario.path}: {exc}", EXIT_FAILED)
    table = Table(title=f"{scenario.name}: switch {fabric_plan.bridge}, MTU {fabric_plan.mtu}"
                  + ("" if scenario.topology.subnet else " (subnet drawn per run)"))
    for column in ("node", "address", "rate", "delay", "jitter", "loss", "queue", "egress qdiscs",
                   "delay by"):
        table.add_column(column)
    for node in fabric_plan.nodes:
        link = node.link
        table.add_row(node.name, node.address, format_rate(link.rate),
                      format_duration(link.delay), format_duration(link.jitter), f"{link.loss:g}%",
                      format_size(link.queue_limit_bytes),
                      " > ".join(q.kind for q in node.egress), node.delay_backend or "-")
    out.print(table)


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--seconds", type=FiniteFloat(positive=True), default=None,
              help="Probe length (default: the scenario's).")
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the result as JSON ('-': stdout).")
def probe(files: tuple[str, ...], seconds: float | None, json_out: str | None) -> None:
    """Build each scenario's network and check that this host can drive its links."""
    from .fabric import Fabric, FabricError, PrivilegeError, ensure_network_privilege
    from .fabric.fidelity import check_fidelity

    scenarios = _load_all(files)
    try:
        ensure_network_privilege()
    except PrivilegeError as exc:
        _fail(str(exc), EXIT_FAILED)
    results, all_trusted = [], True
    table = Table(title="fidelity: achieved / expected TCP goodput")
    for column in ("scenario", "path", "cap", "expected", "achieved", "fraction", "verdict"):
        table.add_column(column)
    for scenario in scenarios:
        try:
            with err.status(f"{scenario.name}: building the network and probing its links"):
                with Fabric(scenario) as fabric:
                    report = check_fidelity(fabric, seconds)
        except FabricError as exc:
            _fail(f"{scenario.path}: {exc}", EXIT_FAILED)
        all_trusted &= report.trusted
        for sample in report.samples:
            ok = sample.fraction >= report.min_fraction
            table.add_row(scenario.name, f"{sample.source} -> {sample.destination}",
                          format_rate(sample.cap_bps), format_rate(sample.expected_bps),
                          format_rate(sample.goodput_bps), f"{sample.fraction:.1%}",
                          "[green]trusted[/]" if ok else "[red]untrusted[/]")
        results.append({"name": scenario.name, "file": str(scenario.path),
                        "fidelity": report.as_dict()})
        if not report.trusted:
            err.print(f"{scenario.name}: {report.reason}")
    _human(json_out).print(table)
    _write_json(json_out, {"scenarios": results})
    sys.exit(EXIT_OK if all_trusted else EXIT_FAILED)


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--json", "json_out", metavar="OUT", help="Write the results as JSON ('-': stdout).")
@click.option("--iterations", type=click.IntRange(min=1), help="Override measured iterations.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Keep rank logs, results and traces here (default: a temporary directory).")
@click.option("--profile", is_flag=True, help="Write a torch.profiler trace per rank and mode.")
@click.option("--allow-untrusted", is_flag=True,
              help="Run scenarios whose links this host cannot drive (results marked untrusted).")
@click.option("--timeout", "timeout_s", type=FiniteFloat(positive=True),
              help="Seconds before hung ranks are killed.")
@click.option("--baseline", metavar="PATH", help="Gate the results against this baseline.")
@click.option("--save-baseline", metavar="PATH", help="Save the results as a baseline.")
@click.option("--tolerance", "tolerances", multiple=True, metavar="METRIC:PCT",
              help="Allowed regression against the baseline, e.g. median:10% (repeatable).")
@click.option("--alpha", type=FiniteFloat(), default=0.05, show_default=True,
              help="Significance level of verdicts and regressions.")
@click.option("--calibration", metavar="FILE", type=click.Path(dir_okay=False),
              help="nccl-tests all_reduce_perf output of the target cluster: sweeps project "
                   "from it (overrides [sweep.projection] calibration).")
def run(files: tuple[str, ...], json_out: str | None, iterations: int | None,
        out_dir: str | None, profile: bool, allow_untrusted: bool, timeout_s: float | None,
        baseline: str | None, save_baseline: str | None, tolerances: tuple[str, ...],
        alpha: float, calibration: str | None) -> None:
    """Train every mode of each scenario on its emulated network and report what it cost."""
    from .fabric import PrivilegeError, ensure_network_privilege
    from .session import NetsimSession, SessionOptionError
    from .sweep import CalibrationError, load_calibration

    scenarios = _load_all(files)
    for scenario in scenarios:
        if scenario.workload is None:
            _fail(f"{scenario.path}: workload: required to run training; add a [workload] "
                  "section (see README)", EXIT_BAD_INPUT)
        if scenario.sweep is not None:  # a bad calibration fails now, not after the sweep
            try:
                load_calibration(scenario, scenario.sweep, calibration)
            except CalibrationError as exc:
                _fail(str(exc), EXIT_BAD_INPUT)
    try:
        session = NetsimSession.create(
            tolerances=list(tolerances) or None, baseline=baseline, alpha=alpha,
            save_baseline=Path(save_baseline) if save_baseline else None,
            iterations=iterations, out_dir=Path(out_dir) if out_dir else None,
            allow_untrusted=allow_untrusted, timeout_s=timeout_s)
    except SessionOptionError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    try:
        ensure_network_privilege()
    except PrivilegeError as exc:
        _fail(str(exc), EXIT_FAILED)
    human = _human(json_out)
    for scenario in scenarios:
        try:
            _run_one(session, scenario, human, profile, calibration)
        except Exception as exc:  # showing a result broke: say so, keep what was measured
            err.print(f"[red]{scenario.name}: error[/]: {escape(f'{type(exc).__name__}: {exc}')}",
                      soft_wrap=True)
        if json_out not in (None, "-"):  # a later scenario that kills the command loses nothing
            _write_json(json_out, session.document(), quiet=True)
    session.finish()
    _write_json(json_out, session.document())
    passed = all(r.passed for r in session.reports) and all(s.passed for s in session.sweeps)
    sys.exit(EXIT_OK if passed else EXIT_FAILED)


def _run_one(session, scenario: Scenario, human: Console, profile: bool,
             calibration: str | None) -> None:
    """One scenario (or sweep) of `run` and its tables; the session records what broke."""
    from .report import mode_table, sweep_tables
    from .session import steal_warning

    if scenario.sweep is not None:
        with err.status("") as status:
            sweep = session.run_sweep(scenario, calibration=calibration,
                                      progress=lambda message: status.update(message))
        for renderable in sweep_tables(sweep):
            human.print(renderable)
        warning = steal_warning([point.report for point in sweep.points])
        if warning:
            human.print(f"[yellow]{escape(warning)}[/]")
        return
    with err.status("") as status:
        report = session.run(scenario, profile=profile,
                             progress=lambda message: status.update(message))
    if report.error:
        err.print(f"[red]{scenario.name}: error[/]: {escape(report.error)}", soft_wrap=True)
        return
    if report.refused:
        human.print(f"[yellow]{scenario.name}: refused[/]: {escape(report.refused)}")
        return
    human.print(mode_table(report))
    for check in report.checks:
        mark = "[green]ok[/]" if check.passed else "[red]FAILED[/]"
        human.print(f"  {mark} {check.name}: {escape(check.detail)}")
    warning = steal_warning([report])
    if warning:
        human.print(f"  [yellow]{escape(warning)}[/]")


@main.command("report")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="report", show_default=True,
              type=click.Path(file_okay=False), help="Folder for the PNGs and the report.")
@click.option("--calibration", metavar="FILE", type=click.Path(dir_okay=False),
              help="nccl-tests all_reduce_perf output of the target cluster: project each "
                   "sweep again from it.")
def report_command(results: str, out_dir: str, calibration: str | None) -> None:
    """Plots (PNG) and a Markdown/HTML report from `netsim-ddp run --json` results."""
    from .calibrate import CalibrationError
    from .ncclparse import NcclParseError
    from .plots import ResultsError, report

    try:
        path = report(results, out_dir, calibration=calibration)
    except (CalibrationError, NcclParseError) as exc:
        _fail(f"--calibration: {exc}", EXIT_BAD_INPUT)
    except ResultsError as exc:
        _fail(f"not a netsim-ddp results file: {exc}", EXIT_BAD_INPUT)
    out.print(f"wrote {path} (and {path.with_suffix('.html').name}, PNGs) in {out_dir}")


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the calibration as JSON ('-': stdout).")
@click.option("--collective", type=click.Choice(["all_reduce", "reduce_scatter", "all_gather"]),
              help="For output that does not say which test ran.")
def calibrate(files: tuple[str, ...], json_out: str | None, collective: str | None) -> None:
    """Fit collective time against message size to nccl-tests output (as printed or pasted,
    or its -J JSON); print per size the measured and modelled time and the error."""
    from .calibrate import ERROR_FROM_BYTES, CalibrationError, load
    from .ncclparse import CALIBRATABLE, NcclParseError

    try:
        found = load(files, collective)
    except (CalibrationError, NcclParseError) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    human = _human(json_out)
    documents = []
    for calibration in found:
        document = calibration.as_dict()
        documents.append(document)
        table = Table(title=calibration.label, title_justify="left")
        for column in ("size", "measured us", "modelled us", "error", "held-out error"):
            table.add_column(column, justify="right", no_wrap=True)
        for row in document["sizes"]:
            table.add_row(format_size(row["size"]), f"{row['measured_s'] * 1e6:.1f}",
                          f"{row['modelled_s'] * 1e6:.1f}", f"{row['error']:+.1%}",
                          "-" if row["held_out_error"] is None
                          else f"{row['held_out_error']:+.1%}")
        table.caption = ("modelled: isotonic + PCHIP through log time vs log size; held-out: "
                         "the curve fitted without that size, predicting it")
        human.print(table)
        line = document["alpha_beta_line"]
        worst, held = (document["max_abs_error_from_1MiB"],
                       document["max_abs_held_out_error_from_1MiB"])
        if worst is not None:
            human.print(f"from {format_size(ERROR_FROM_BYTES)} up: max |error| {worst:.1%}"
                        + (f", held out {held:.1%}" if held is not None else ""))
        human.print(f"busbw plateau {document['busbw_bytes_per_s'] / 1e9:.2f} GB/s; one "
                    f"alpha-beta line (alpha {line['alpha_s'] * 1e6:.1f} us) would miss by up "
                    f"to {line['max_abs_error']:.0%}")
        if calibration.collective != "all_reduce":
            kind = "fitted" if calibration.collective in CALIBRATABLE else "fitted anyway"
            human.print(f"[yellow]{calibration.collective}: {kind}; projections use all_reduce "
                        "only (DDP's collective)[/]")
    _write_json(json_out, {"calibrations": documents})


@main.command()
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
def clean(dry_run: bool) -> None:
    """Remove namespaces left by killed runs (live runs are left alone)."""
    from .fabric.sweep import sweep_stale

    report = sweep_stale(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for name in report.removed:
        out.print(f"{verb} namespace {name}")
    for run_id, pid in report.live_runs.items():
        out.print(f"left run {run_id} alone: it is live (pid {pid})")
    if report.killed_processes:
        out.print(f"killed {report.killed_processes} leftover processes")
    if not report.removed:
        out.print("nothing to clean")


if __name__ == "__main__":
    main()
