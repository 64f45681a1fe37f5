"""`netsim-ddp`: the command line. Exit codes: 0 ok, 1 a check failed, 2 bad input."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from netsim_ddp.common.files import write_whole
from netsim_ddp.common.options import HEARTBEAT_TIMEOUT_S, JOIN_TIMEOUT_S, SESSION_OPTIONS
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.units import format_duration, format_rate, format_size

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

# Logs (CI, files) are not terminals: give tables room rather than rich's default 80 columns.
_LOG_WIDTH = 120
out = Console(highlight=False, width=None if sys.stdout.isatty() else _LOG_WIDTH)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else _LOG_WIDTH)


def _fail(message: str, code: int) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    sys.exit(code)


def _load_all(paths: tuple[str, ...], host_check: bool = True) -> list[Scenario]:
    """Every scenario, validated and checked against what this host can hold (every point of
    a sweep too), before anything is built: the first bad one ends the command."""
    from netsim_ddp.scenario.limits import HostResources, check_host

    host = HostResources.probe()
    scenarios = []
    for path in paths:
        try:
            scenario = Scenario.load(path)
            if host_check:
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


class RateParam(click.ParamType):
    """A link rate with its unit ('400gbit', '50GB/s'), in bits per second, > 0."""

    name = "rate"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        from netsim_ddp.scenario.units import parse_rate

        try:
            rate = parse_rate(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if rate <= 0:
            self.fail(f"{value!r} must be greater than 0", param, ctx)
        return rate


NICS_HELP = ("NICs in one server of the calibrated cluster (default 1; H100 servers usually "
             "have one per GPU): min(GPUs, NICs) carry a server's traffic.")
NIC_RATE_HELP = ("One NIC's line rate, e.g. 400gbit (default: typical for the calibration's "
                 "GPUs): a 2-host bus bandwidth above what a ring over the NICs reaches is "
                 "NCCL's tree, flagged.")


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
    write_whole(target, text + "\n")  # never a half-written results file
    if not quiet:
        err.print(f"wrote {target}")


def _session_options(*names: str):
    """The session options (session.SESSION_OPTIONS, which pytest takes too) named, as click
    options of a command."""

    def decorate(command):
        for name in reversed(names):
            option = SESSION_OPTIONS[name]
            kind = option.kind
            extra: dict[str, Any] = (
                {"is_flag": True} if kind == "flag" else
                {"multiple": True} if kind == "list" else
                {"type": click.IntRange(min=1)} if kind == "count" else
                {"type": click.Path(file_okay=False)} if kind == "folder" else
                {"type": FiniteFloat(), "default": option.default, "show_default": True}
                if kind == "fraction" else {})
            if option.metavar:
                extra["metavar"] = option.metavar
            command = click.option(f"--{option.name}", option.dest, help=option.help,
                                   **extra)(command)
        return command

    return decorate


_gate_options = _session_options("baseline", "save-baseline", "tolerance", "alpha")


# The commands that build namespaces. Without root, the process enters its user namespace
# before such a command starts, while it has one thread (or is started again inside it: see
# fabric/privilege.py); a refusal is reported where the command needs the network.
NETWORK_COMMANDS = frozenset({"check", "plan", "probe", "run"})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netsim-ddp")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Emulate a cluster network on this host and test DDP training on it."""
    if ctx.invoked_subcommand in NETWORK_COMMANDS:
        from .fabric.privilege import prepare

        prepare(restart=True)


@main.command()
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the result as JSON ('-': stdout).")
def check(json_out: str | None) -> None:
    """Print what this host can emulate; exit 1 if it can build nothing."""
    from netsim_ddp.workload.gpus import probe_gpus

    from .fabric.capabilities import probe_capabilities, torch_status

    caps = probe_capabilities()
    torch_info = torch_status()
    gpus = probe_gpus()
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
        ("GPUs", gpus.count if gpus.count else False,
         ", ".join(gpus.names) or "ranks on GPUs (backend nccl)"),
        ("NCCL", gpus.nccl or False, "GPU collectives"),
        ("NCCL path", gpus.nccl_usable and caps.can_build,
         "NCCL over the emulated links" if gpus.nccl_usable and caps.can_build
         else f"not here: {gpus.missing or 'no emulated network can be built'}"),
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
    _write_json(json_out, {"capabilities": caps.as_dict(), "torch": torch_info,
                           "gpus": gpus.as_dict() | {"nccl_path": gpus.nccl_usable
                                                     and caps.can_build}})
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


class MachineParam(click.ParamType):
    """A kind of machine, 'cores=16,memory=64GiB' (scenario.sizing.MachineSpec)."""

    name = "machine"

    def convert(self, value, param, ctx):
        from netsim_ddp.scenario.sizing import MachineSpec

        if isinstance(value, MachineSpec):
            return value
        try:
            return MachineSpec.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@main.command()
@click.argument("file")
@click.option("--gpus", type=click.IntRange(min=0), default=None,
              help="Plan the ranks for a host with this many GPUs (default: this host's).")
@click.option("--machine", type=MachineParam(), default=None, metavar="cores=N,memory=SIZE",
              help="Size the scenario in machines of this kind: how many it needs at which "
              "dilation (e.g. cores=16,memory=64GiB).")
def plan(file: str, gpus: int | None, machine) -> None:
    """Show the network a scenario builds and where its ranks run, whether this host holds
    it, and (--machine) how many machines of a kind it needs; builds nothing. Exit 1 if it
    does not fit this host (without --machine) or no machine of the kind holds one node."""
    import ipaddress

    from .fabric import FabricError
    from .fabric.capabilities import probe_capabilities
    from .fabric.plan import plan_fabric

    (scenario,) = _load_all((file,), host_check=False)
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
    if scenario.workload is not None and not _print_placement(scenario, fabric_plan, gpus):
        sys.exit(EXIT_FAILED)
    if not _print_fit(scenario, machine):
        sys.exit(EXIT_FAILED)


def _print_fit(scenario: Scenario, machine) -> bool:
    """Whether this host holds the scenario; with a machine kind, how many it needs."""
    from netsim_ddp.report.sizing import host_fit, sizing_summary, sizing_table
    from netsim_ddp.scenario.limits import HostResources
    from netsim_ddp.scenario.sizing import size_machines

    fits, lines = host_fit(scenario, HostResources.probe())
    for line in lines:
        out.print(escape(line), soft_wrap=True)
    if machine is None:
        return fits
    sizing = size_machines(scenario, machine)
    k = scenario.emulation.dilation if scenario.emulation else 1.0
    this_k = None if k == "auto" else float(k)
    out.print(sizing_table(sizing, this_k))
    out.print(escape(sizing_summary(sizing, this_k)), soft_wrap=True)
    return any(row.machines for row in sizing.rows)


def _print_placement(scenario: Scenario, fabric_plan, gpus: int | None) -> bool:
    """The ranks: backend, each rank's device, each node's NCCL environment. False if this
    host (or one with `gpus` GPUs) would refuse the scenario."""
    from netsim_ddp.workload.gpus import GpuInventory, probe_gpus
    from netsim_ddp.workload.placement import place

    assert scenario.workload is not None
    inventory = probe_gpus()
    if gpus is not None:  # a GPU host as the user describes it, with NCCL
        inventory = GpuInventory(gpus, missing=None if gpus else "no GPUs (--gpus 0)")
    placement = place(scenario.workload, scenario.topology, inventory)
    where = f"a host with {gpus} GPUs" if gpus is not None else "this host"
    if placement.refused:
        out.print(f"ranks: {escape(placement.describe())}", soft_wrap=True)
        if gpus is None:
            out.print("(plan for a GPU host with --gpus N)")
        return False
    out.print(f"ranks on {where}: {escape(placement.describe())}", soft_wrap=True)
    table = Table()
    for column in ("node", "local rank", "rank", "device"):
        table.add_column(column)
    per_node = scenario.topology.ranks_per_node
    for node in fabric_plan.nodes:
        for local in range(per_node):
            device = (f"cuda:{placement.gpus.devices[node.index][local]}" if placement.gpus
                      else "cpu")
            table.add_row(node.name, str(local), str(node.index * per_node + local), device)
    out.print(table)
    envs = placement.node_env("<run>", [node.name for node in fabric_plan.nodes])
    for node, env in zip(fabric_plan.nodes, envs, strict=True):
        if env:
            out.print(f"{node.name} env: " + " ".join(f"{k}={v}" for k, v in env.items()),
                      soft_wrap=True)
    return True


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
@_session_options("json", "iterations", "out")
@click.option("--profile", is_flag=True, help="Write a torch.profiler trace per rank and mode.")
@_session_options("allow-untrusted")
@click.option("--timeout", "timeout_s", type=FiniteFloat(positive=True),
              help="Seconds before hung ranks are killed.")
@_gate_options
@_session_options("history")
@click.option("--calibration", metavar="FILE", type=click.Path(dir_okay=False), multiple=True,
              help="nccl-tests output of the target cluster (all_reduce_perf on 2+ servers; "
                   "repeat for a one-server run: NVLink): sweeps project from it (overrides "
                   "[sweep.projection] calibration).")
def run(files: tuple[str, ...], json_out: str | None, iterations: int | None,
        out_dir: str | None, profile: bool, allow_untrusted: bool, timeout_s: float | None,
        baseline: str | None, save_baseline: str | None, tolerances: tuple[str, ...],
        alpha: float, history_dir: str | None, calibration: tuple[str, ...]) -> None:
    """Train every mode of each scenario on its emulated network and report what it cost."""
    from netsim_ddp.run.sweep import CalibrationError, load_calibration

    scenarios = _load_all(files)
    for scenario in scenarios:
        if scenario.workload is None:
            _fail(f"{scenario.path}: workload: required to run training; add a [workload] "
                  "section (see README)", EXIT_BAD_INPUT)
        if scenario.sweep is not None:  # a bad calibration fails now, not after the sweep
            try:
                load_calibration(scenario, scenario.sweep, calibration or None)
            except CalibrationError as exc:
                _fail(str(exc), EXIT_BAD_INPUT)
    session = _start_session(tolerances, baseline, alpha, save_baseline, iterations, out_dir,
                             allow_untrusted, timeout_s, history_dir)
    human = _human(json_out)
    for scenario in scenarios:
        try:
            _run_one(session, scenario, human, profile, list(calibration) or None)
        except Exception as exc:  # showing a result broke: say so, keep what was measured
            err.print(f"[red]{scenario.name}: error[/]: {escape(f'{type(exc).__name__}: {exc}')}",
                      soft_wrap=True)
        if json_out not in (None, "-"):  # a later scenario that kills the command loses nothing
            _write_json(json_out, session.document().dump(), quiet=True)
    session.finish()
    _write_json(json_out, session.document().dump())
    passed = all(r.passed for r in session.reports) and all(s.passed for s in session.sweeps)
    sys.exit(EXIT_OK if passed else EXIT_FAILED)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("file")
@_session_options("json", "iterations", "out", "allow-untrusted")
@click.option("--timeout", "timeout_s", type=FiniteFloat(positive=True),
              help="Seconds each variant's ranks may take before they are killed.")
@_gate_options
@_session_options("history")
@click.option("--steps", type=click.Choice(["auto", "optimizer", "marker"]), default=None,
              help="What ends a step: optimizer.step() or netsim_ddp.step() (default: the "
                   "scenario's, else auto).")
@click.option("--after-measured", type=click.Choice(["stop", "finish"]), default=None,
              help="Stop the script once its steps are measured, or let it finish.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch(file: str, json_out: str | None, iterations: int | None, out_dir: str | None,
           allow_untrusted: bool, timeout_s: float | None, baseline: str | None,
           save_baseline: str | None, tolerances: tuple[str, ...], alpha: float,
           history_dir: str | None, steps: str | None, after_measured: str | None,
           command: tuple[str, ...]) -> None:
    """Run your own training script in FILE's emulated network, as torchrun would on every
    node, and measure it like `run`: netsim-ddp launch FILE [OPTIONS] -- SCRIPT|-m MODULE ARGS.

    Without a command after --, FILE's own [workload] command runs."""
    (scenario,) = _load_all((file,))
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    settings = {key: value for key, value in (("steps", steps),
                                              ("after_measured", after_measured)) if value}
    if argv or settings:
        if not argv and (scenario.workload is None or scenario.workload.command is None):
            _fail(f"{file}: no command: give one after -- (netsim-ddp launch {file} -- "
                  "train.py ARGS)", EXIT_BAD_INPUT)
        if argv and argv[0] != "-m":
            if not Path(argv[0]).is_file():
                _fail(f"no script {argv[0]!r} (give a script file, or -m MODULE)",
                      EXIT_BAD_INPUT)
            argv[0] = str(Path(argv[0]).resolve())
        workload = scenario.workload
        try:
            scenario = scenario.with_command(
                argv or list(workload.command or []) if workload else argv, **settings)
        except ScenarioError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
    elif scenario.workload is None or scenario.workload.command is None:
        _fail(f"{file}: no command: give one after -- (netsim-ddp launch {file} -- train.py "
              "ARGS), or a [workload] command in the file", EXIT_BAD_INPUT)
    session = _start_session(tolerances, baseline, alpha, save_baseline, iterations, out_dir,
                             allow_untrusted, timeout_s, history_dir)
    human = _human(json_out)
    try:
        _run_one(session, scenario, human, False, None)
    except Exception as exc:  # showing a result broke: say so, keep what was measured
        err.print(f"[red]{scenario.name}: error[/]: {escape(f'{type(exc).__name__}: {exc}')}",
                  soft_wrap=True)
    session.finish()
    _write_json(json_out, session.document().dump())
    sys.exit(EXIT_OK if all(r.passed for r in session.reports) else EXIT_FAILED)


def _run_one(session, scenario: Scenario, human: Console, profile: bool,
             calibration: list[str] | None) -> None:
    """One scenario (or sweep) of `run` and its tables; the session records what broke."""
    from netsim_ddp.report.tables import sweep_tables
    from netsim_ddp.run.session import steal_warning

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
    _print_report(human, report)


def _print_report(human: Console, report) -> None:
    """A trained scenario's table, checks and warnings (`run` and `host` alike)."""
    from netsim_ddp.report.tables import mode_table
    from netsim_ddp.run.session import steal_warning

    human.print(mode_table(report))
    for check in report.checks:
        mark = "[green]ok[/]" if check.passed else "[red]FAILED[/]"
        human.print(f"  {mark} {check.name}: {escape(check.detail)}")
    warning = steal_warning([report])
    if warning:
        human.print(f"  [yellow]{escape(warning)}[/]")


@main.command()
@click.argument("file")
@click.option("--node-rank", type=click.IntRange(min=0), required=True,
              help="This host is the scenario's node I (0: it hosts the job and writes results).")
@click.option("--nnodes", type=click.IntRange(min=1), required=True,
              help="Hosts in the job; must equal the scenario's topology.nodes.")
@click.option("--master-addr", required=True, help="Node 0's address, reachable by every host.")
@click.option("--master-port", type=click.IntRange(1, 65535), required=True,
              help="Node 0's port for the job's c10d store (and torchrun's rendezvous).")
@click.option("--nic", required=True, help="This host's NIC between the hosts: it is shaped.")
@_session_options("json", "out", "iterations")
@click.option("--timeout", "timeout_s", type=FiniteFloat(positive=True),
              help="Seconds before hung ranks are killed.")
@click.option("--join-timeout", "join_timeout_s", type=FiniteFloat(positive=True),
              default=JOIN_TIMEOUT_S, show_default=True,
              help="Seconds to wait for every host to arrive.")
@click.option("--heartbeat-timeout", "heartbeat_timeout_s", type=FiniteFloat(positive=True),
              default=HEARTBEAT_TIMEOUT_S, show_default=True,
              help="Seconds a host may stay silent before the run ends naming it as gone.")
@click.option("--no-ingress", is_flag=True, help="Shape egress only (no ifb on this host).")
@_session_options("allow-untrusted")
@_gate_options
def host(file: str, node_rank: int, nnodes: int, master_addr: str, master_port: int, nic: str,
         json_out: str | None, out_dir: str | None, iterations: int | None,
         timeout_s: float | None, join_timeout_s: float, heartbeat_timeout_s: float,
         no_ingress: bool,
         allow_untrusted: bool, baseline: str | None, save_baseline: str | None,
         tolerances: tuple[str, ...], alpha: float) -> None:
    """Be one host of a scenario on a real cluster: run once per host (srun, a Kubernetes
    Job, ssh). Shapes --nic to this node's link, trains with the other hosts, restores the
    NIC exactly; node 0 reports as `run` does."""
    import secrets

    from netsim_ddp.run.host_agent import HostConfigError, HostError, HostOptions, run_host
    from netsim_ddp.run.runner import run_folder
    from netsim_ddp.run.session import NetsimSession, SessionOptionError
    from netsim_ddp.verdicts.scenario_report import ScenarioReport

    from .fabric import FabricError
    from .workload import WorkloadError

    (scenario,) = _load_all((file,))
    if scenario.workload is not None and scenario.workload.is_script:
        _fail(f"{file}: workload.command: `host` runs the built-in loop only; run a script "
              "on one host's emulated network with `netsim-ddp launch`", EXIT_BAD_INPUT)
    try:
        session = NetsimSession.create(
            tolerances=list(tolerances) or None, baseline=baseline, alpha=alpha,
            save_baseline=Path(save_baseline) if save_baseline else None)
    except SessionOptionError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    for warning in session.warnings:
        err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
    options = HostOptions(
        scenario=scenario, node_rank=node_rank, nnodes=nnodes, master_addr=master_addr,
        master_port=master_port, nic=nic, iterations=iterations, timeout_s=timeout_s,
        # A folder of this agent's own, as for `run`: a reused --out never replays old files.
        out_dir=run_folder(Path(out_dir) if out_dir else None, secrets.token_hex(3)).resolve(),
        join_timeout_s=join_timeout_s, heartbeat_timeout_s=heartbeat_timeout_s,
        allow_untrusted=allow_untrusted, ingress=not no_ingress)
    human = _human(json_out)
    try:
        outcome = run_host(options, progress=lambda message: err.print(escape(message)))
    except HostConfigError as exc:  # refused before anything changed
        _fail(str(exc), EXIT_BAD_INPUT)
    except HostError as exc:
        if node_rank != 0:
            _fail(str(exc), EXIT_FAILED)
        outcome = ScenarioReport(scenario, error=str(exc))
    except (FabricError, WorkloadError) as exc:
        _fail(str(exc), EXIT_FAILED)
    if isinstance(outcome, str):  # not node 0: the verdict is node 0's to report
        out.print(f"{options.node_name}: job finished ({outcome}); node 0 reports the results")
        sys.exit(EXIT_OK if outcome == "passed" else EXIT_FAILED)
    if outcome.error:
        err.print(f"[red]{scenario.name}: error[/]: {escape(outcome.error)}", soft_wrap=True)
    elif outcome.refused:
        human.print(f"[yellow]{scenario.name}: refused[/]: {escape(outcome.refused)}")
    else:
        if session.baseline is not None:
            outcome.checks.extend(session.gate(outcome))
        _print_report(human, outcome)
    session.reports.append(outcome)
    session.finish()
    _write_json(json_out, session.document().dump())
    sys.exit(EXIT_OK if outcome.passed else EXIT_FAILED)


@main.command("profile-compute")
@click.argument("file")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="The profile JSON to write (workload.profile reads it).")
@click.option("--steps", type=click.IntRange(min=2), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--mode", "mode_name", default="fp32", show_default=True,
              help="Precision mode to time (autocast for amp modes).")
@click.option("--device", default=None, help="cuda:0, cpu, ... (default: the first GPU, "
              "else the CPU).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU threads (the ranks run with one each).")
def profile_compute_command(file: str, out_path: str, steps: int, warmup: int, mode_name: str,
                            device: str | None, threads: int) -> None:
    """Time FILE's model on one device, no network: forward, each layer's backward (CUDA
    events on a GPU), optimizer; write the per-layer profile compute replay reads."""
    scenario, = _load_all((file,))
    if scenario.workload is None:
        _fail(f"{file}: workload: required to profile compute", 2)
    assert scenario.workload is not None
    import torch

    from .workload.compute_profiler import profile_compute

    torch.set_num_threads(threads)
    profile = profile_compute(scenario.workload, mode_name=mode_name, steps=steps,
                              warmup=warmup, device=torch.device(device) if device else None,
                              progress=click.echo)
    Path(out_path).write_text(profile.model_dump_json(indent=1), encoding="utf-8")
    click.echo(f"{out_path}: {profile.model} on {profile.device}: forward + backward median "
               f"{profile.compute_s * 1e3:.1f} ms (step-to-step cv {profile.spread:.3f}), "
               f"{len(profile.layers)} layers; use it as workload.profile")


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
    from netsim_ddp.measure.document import DocumentError
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
            _fail(f"--history: {exc}", EXIT_BAD_INPUT)
        judged = judge_history(runs)
        judged.notes[:0] = notes
    try:
        if not calibration and (nics_per_server is not None or nic_bandwidth is not None):
            _fail("--nics-per-server/--nic-bandwidth describe a --calibration's servers: give "
                  "the calibration too", EXIT_BAD_INPUT)
        path = report(results, out_dir, calibration=list(calibration) or None, history=judged,
                      nics_per_server=nics_per_server, nic_bandwidth_bps=nic_bandwidth)
    except (CalibrationError, NcclParseError) as exc:
        _fail(f"--calibration: {exc}", EXIT_BAD_INPUT)
    except DocumentError as exc:
        _fail(f"not a netsim-ddp results file: {exc}", EXIT_BAD_INPUT)
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
def history(results: tuple[str, ...], metrics: tuple[str, ...], tolerances: tuple[str, ...],
            alpha: float, as_given: bool, json_out: str | None, out_dir: str | None) -> None:
    """Change points in the history of earlier runs (`run --json` files, or folders of
    them), and a verdict on the newest run; exit 1 if it regressed."""
    from netsim_ddp.report.ci import append_step_summary, change_text, history_summary
    from netsim_ddp.verdicts.history import (
        HistoryError,
        judge_history,
        load_runs,
        parse_metrics,
        runs_in,
    )

    if not 0 < alpha < 1:
        _fail(f"--alpha must be between 0 and 1, got {alpha}", EXIT_BAD_INPUT)
    paths = [path for given in results
             for path in (runs_in(given) if Path(given).is_dir() else [Path(given)])]
    try:
        chosen, fractions = parse_metrics(metrics, tolerances)
        runs, notes = load_runs(paths, by_time=not as_given)
    except HistoryError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    report = judge_history(runs, chosen, fractions, alpha)
    report.notes[:0] = notes
    human = _human(json_out)
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
    _write_json(json_out, report.as_dict())
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
    from netsim_ddp.measure.document import DocumentError, load_document
    from netsim_ddp.report.ci import bencher_metrics, github_benchmark

    try:
        document = load_document(results)
    except DocumentError as exc:
        _fail(f"not a netsim-ddp results file: {exc}", EXIT_BAD_INPUT)
    data = (bencher_metrics(document) if kind == "bencher"
            else github_benchmark(document, bigger_is_better=kind.endswith("-bigger")))
    _write_json(out_file, data)  # type: ignore[arg-type]


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
    """Fit collective time against message size to nccl-tests output (as printed or pasted,
    or its -J JSON); print per size the measured and modelled time, the error in sample and
    held out, and whether a multi-host all_reduce can be extrapolated to more hosts."""
    from netsim_ddp.projection.calibrate import (
        ERROR_FROM_BYTES,
        CalibrationError,
        load,
        projection_use,
    )
    from netsim_ddp.projection.cluster import check_network, nics_of
    from netsim_ddp.projection.nccl_tests import CALIBRATABLE, NcclParseError

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
        for column in ("size", "measured us", "modelled us", "in-sample error",
                       "held-out error"):
            table.add_column(column, justify="right", no_wrap=True)
        for row in document["sizes"]:
            table.add_row(format_size(row["size"]), f"{row['measured_s'] * 1e6:.1f}",
                          f"{row['modelled_s'] * 1e6:.1f}", f"{row['error']:+.1%}",
                          "-" if row["held_out_error"] is None
                          else f"{row['held_out_error']:+.1%}")
        table.caption = ("modelled: isotonic + PCHIP through log time vs log size. In sample: "
                         "the curve through every size, ~0 by construction; held out: the "
                         "curve fitted without that size, predicting it (the honest one)")
        human.print(table)
        line = document["alpha_beta_line"]
        worst, held = (document["max_abs_error_from_1MiB"],
                       document["max_abs_held_out_error_from_1MiB"])
        if worst is not None:
            human.print(f"from {format_size(ERROR_FROM_BYTES)} up: max |held-out error| "
                        + (f"{held:.1%}" if held is not None else "- (too few sizes)")
                        + f" (in sample {worst:.1%})")
        human.print(f"busbw plateau {document['busbw_bytes_per_s'] / 1e9:.2f} GB/s; one "
                    f"alpha-beta line (alpha {line['alpha_s'] * 1e6:.1f} us) would miss by up "
                    f"to {line['max_abs_error']:.0%}")
        if calibration.hosts > 1 and calibration.collective == "all_reduce":
            try:
                nics = nics_of(calibration, nics_per_server=nics_per_server,
                               nic_bandwidth_bps=nic_bandwidth, where="--calibration")
            except CalibrationError as exc:
                _fail(str(exc), EXIT_BAD_INPUT)
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
    _write_json(json_out, {"calibrations": documents})


@main.command()
@click.option("--dry-run", is_flag=True, help="Only list what would be removed; writes nothing.")
@click.option("--forget-nic", metavar="NIC",
              help="Drop the records of killed agents' NIC of this name without restoring it "
                   "(after you put the NIC right by hand); nothing else is cleaned.")
def clean(dry_run: bool, forget_nic: str | None) -> None:
    """Remove what killed runs left (namespaces, processes, lock files) and restore NICs of
    killed `host` agents; live runs and agents are spared. Exit 1 if a NIC is left changed."""
    from .fabric.stale import clean_stale_runs

    if forget_nic is not None:
        if not _clean_nics(dry_run, forget_nic):
            out.print(f"no record of a killed agent names {escape(forget_nic)}")
        return
    report = clean_stale_runs(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for name in report.removed:
        out.print(f"{verb} namespace {name}")
    if report.killed_processes:
        out.print(f"{'would kill' if dry_run else 'killed'} {report.killed_processes} "
                  "leftover processes")
    for run_id in report.removed_locks:
        out.print(f"{verb} the lock file of dead run {run_id}")
    for run_id, pid in report.live_runs.items():
        out.print(f"left run {run_id} alone: it is live (pid {pid})")
    if report.root_litter:
        out.print(f"root's killed runs left {len(report.root_litter)} namespaces "
                  f"({', '.join(report.root_litter)}): run `sudo netsim-ddp clean` to remove them")
    nics = _clean_nics(dry_run)
    orphans = _clean_orphan_nic_locks(dry_run)
    if not (report.removed or report.killed_processes or report.removed_locks or nics
            or orphans):
        out.print("nothing to clean")
    if any(nic.left_changed for nic in nics):
        sys.exit(EXIT_FAILED)


def _clean_orphan_nic_locks(dry_run: bool) -> list:
    """Lock files of NIC records that are gone (root's: only root may remove them)."""
    from .fabric.nic import remove_orphan_locks
    from .fabric.privilege import host_root

    if not host_root():
        return []
    orphans = remove_orphan_locks(dry_run=dry_run)
    if orphans:
        verb = "would remove" if dry_run else "removed"
        out.print(f"{verb} {len(orphans)} lock files of NIC records that are gone")
    return orphans

def _clean_nics(dry_run: bool, forget: str | None = None) -> list:
    """Real NICs whose `netsim-ddp host` agent was killed: restored as recorded (or their
    records forgotten)."""
    from .fabric.nic import recorded_nics, restore_stale_nics
    from .fabric.privilege import host_root

    if not host_root():  # agents that shape NICs run as root: their state files are root's
        if recorded := recorded_nics():
            out.print(f"root's `host` agents recorded {len(recorded)} NICs: only root can tell "
                      "whether an agent was killed and restore its NIC (`sudo netsim-ddp clean`)")
        return []
    found = restore_stale_nics(dry_run=dry_run, forget=forget)
    for nic in found:
        where = f"{nic.ifname} (network namespace {nic.netns_inode}, agent pid {nic.pid})"
        line = {"restored": f"restored {where} as its agent recorded it"
                            + (f"; killed {nic.killed_processes} of its processes"
                               if nic.killed_processes else ""),
                "would-restore": f"would restore {where}",
                "gone": f"dropped the record of {where}: {nic.error}",
                "would-drop": f"would drop the record of {where}: {nic.error}",
                "forgotten": f"forgot the record of {where}; the NIC was not touched",
                "would-forget": f"would forget the record of {where}"}.get(nic.outcome)
        if line is not None:
            out.print(escape(line), soft_wrap=True)
        else:
            err.print(f"[red]could not restore {escape(where)}[/]: {escape(str(nic.error))}",
                      soft_wrap=True)
    return found


def _start_session(tolerances, baseline, alpha, save_baseline, iterations, out_dir,
                   allow_untrusted, timeout_s, history_dir):
    """`run` and `launch`: the session of runs from the shared options, its warnings, and the
    network privilege (root, or the user namespace) before anything is built."""
    from .fabric import PrivilegeError, ensure_network_privilege
    from .run.session import NetsimSession, SessionOptionError

    try:
        session = NetsimSession.create(
            tolerances=list(tolerances) or None, baseline=baseline, alpha=alpha,
            save_baseline=Path(save_baseline) if save_baseline else None,
            iterations=iterations, out_dir=Path(out_dir) if out_dir else None,
            allow_untrusted=allow_untrusted, timeout_s=timeout_s,
            history_dir=Path(history_dir) if history_dir else None)
    except SessionOptionError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    for warning in session.warnings:
        err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
    _warn_about_stale_runs()
    try:
        ensure_network_privilege()
    except PrivilegeError as exc:
        _fail(str(exc), EXIT_FAILED)
    return session


def _warn_about_stale_runs() -> None:
    """Namespaces or processes of killed runs load the host and blur this run's numbers."""
    from .fabric.stale import clean_stale_runs

    stale = clean_stale_runs(dry_run=True)  # only looks
    if stale.harmful:
        err.print(f"[yellow]warning:[/] {escape(stale.describe())}; they can load this host "
                  "and distort the results: `netsim-ddp clean` removes them (live runs are "
                  "spared)", soft_wrap=True)


if __name__ == "__main__":
    main()
