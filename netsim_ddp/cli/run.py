"""Commands that train: run, launch (a user's script), host (one host of a real cluster),
profile-compute."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from netsim_ddp.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    FiniteFloat,
    NetworkCommand,
    err,
    exit_code,
    fail_command,
    gate_options,
    human_console,
    load_scenarios,
    main,
    out,
    session_options,
    timeout_option,
    write_json,
)
from netsim_ddp.common.options import HEARTBEAT_TIMEOUT_S, JOIN_TIMEOUT_S
from netsim_ddp.scenario.spec import Scenario, ScenarioError


@main.command(cls=NetworkCommand)
@click.argument("files", nargs=-1, required=True)
@session_options("json", "iterations", "out")
@click.option("--profile", is_flag=True, help="Write a torch.profiler trace per rank and mode.")
@session_options("allow-untrusted")
@timeout_option
@gate_options
@session_options("history")
@click.option("--calibration", metavar="FILE", type=click.Path(dir_okay=False), multiple=True,
              help="nccl-tests output of the target cluster (all_reduce_perf on 2+ servers; "
                   "repeat for a one-server run: NVLink): sweeps project from it (overrides "
                   "[sweep.projection] calibration).")
def run(files: tuple[str, ...], json_out: str | None, iterations: int | None,
        out_dir: str | None, profile: bool, allow_untrusted: bool, timeout_s: float | None,
        baseline: str | None, save_baseline: str | None, tolerances: tuple[str, ...],
        alpha: float, history_dir: str | None, calibration: tuple[str, ...]) -> None:
    """Train every mode of each scenario on its emulated network and report what it cost."""
    from netsim_ddp.projection.calibrate import CalibrationError
    from netsim_ddp.run.sweep import load_calibration

    scenarios = load_scenarios(files)
    for scenario in scenarios:
        if scenario.workload is None:
            fail_command(f"{scenario.path}: workload: required to run training; add a [workload] "
                         "section (see README)", EXIT_BAD_INPUT)
        if scenario.sweep is not None:  # a bad calibration fails now, not after the sweep
            try:
                load_calibration(scenario, scenario.sweep, calibration or None)
            except CalibrationError as exc:
                fail_command(str(exc), EXIT_BAD_INPUT)
    session = _start_session(tolerances, baseline, alpha, save_baseline, iterations, out_dir,
                             allow_untrusted, timeout_s, history_dir)
    human = human_console(json_out)
    for scenario in scenarios:
        try:
            _run_one(session, scenario, human, profile, list(calibration) or None)
        except Exception as exc:  # showing a result broke: say so, keep what was measured
            err.print(f"[red]{scenario.name}: error[/]: {escape(f'{type(exc).__name__}: {exc}')}",
                      soft_wrap=True)
        if json_out not in (None, "-"):  # a later scenario that kills the command loses nothing
            write_json(json_out, session.document().dump(), quiet=True)
    session.finish()
    write_json(json_out, session.document().dump())
    sys.exit(exit_code([r.status for r in session.reports] + [s.status for s in session.sweeps]))


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("file")
@session_options("json", "iterations", "out", "allow-untrusted")
@timeout_option
@gate_options
@session_options("history")
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
    (scenario,) = load_scenarios((file,))
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    settings = {key: value for key, value in (("steps", steps),
                                              ("after_measured", after_measured)) if value}
    if argv or settings:
        if not argv and (scenario.workload is None or scenario.workload.command is None):
            fail_command(f"{file}: no command: give one after -- (netsim-ddp launch {file} -- "
                         "train.py ARGS)", EXIT_BAD_INPUT)
        if argv and argv[0] != "-m":
            if not Path(argv[0]).is_file():
                fail_command(f"no script {argv[0]!r} (give a script file, or -m MODULE)",
                             EXIT_BAD_INPUT)
            argv[0] = str(Path(argv[0]).resolve())
        workload = scenario.workload
        try:
            scenario = scenario.with_command(
                argv or list(workload.command or []) if workload else argv, **settings)
        except ScenarioError as exc:
            fail_command(str(exc), EXIT_BAD_INPUT)
    elif scenario.workload is None or scenario.workload.command is None:
        fail_command(f"{file}: no command: give one after -- (netsim-ddp launch {file} -- train.py "
                     "ARGS), or a [workload] command in the file", EXIT_BAD_INPUT)
    session = _start_session(tolerances, baseline, alpha, save_baseline, iterations, out_dir,
                             allow_untrusted, timeout_s, history_dir)
    human = human_console(json_out)
    try:
        _run_one(session, scenario, human, False, None)
    except Exception as exc:  # showing a result broke: say so, keep what was measured
        err.print(f"[red]{scenario.name}: error[/]: {escape(f'{type(exc).__name__}: {exc}')}",
                  soft_wrap=True)
    session.finish()
    write_json(json_out, session.document().dump())
    sys.exit(exit_code(r.status for r in session.reports))


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
        human.print(f"[yellow]{scenario.name}: UNTRUSTED[/]: {escape(report.untrusted_reason)}")
        return
    _print_report(human, report)


def _print_report(human: Console, report) -> None:
    """A trained scenario's table, checks and warnings (`run` and `host` alike)."""
    from netsim_ddp.report.tables import mode_table
    from netsim_ddp.run.session import steal_warning

    human.print(mode_table(report))
    if any(mode.iteration.slow_share for mode in report.modes.values()):
        from netsim_ddp.report.tail_tables import tail_table  # only runs with a tail print it

        human.print(tail_table(report))
    for check in report.checks:
        mark = ("[green]ok[/]" if check.passed else "[red]FAILED[/]" if check.kind == "code"
                else "[yellow]UNTRUSTED[/]")
        human.print(f"  {mark} {check.name}: {escape(check.detail)}")
    warning = steal_warning([report])
    if warning:
        human.print(f"  [yellow]{escape(warning)}[/]")
    if report.status == "untrusted":
        human.print(f"  [yellow]{report.scenario.name}: UNTRUSTED[/]: "
                    f"{escape(report.untrusted_reason)}")


def _agent_wait_options(member: str):
    """`host` and `machine`: how long an agent waits for the others (`member`: what each is)."""

    def decorate(command):
        command = click.option(
            "--heartbeat-timeout", "heartbeat_timeout_s", type=FiniteFloat(positive=True),
            default=HEARTBEAT_TIMEOUT_S, show_default=True,
            help=f"Seconds a {member} may stay silent before the run ends naming it as gone.",
        )(command)
        return click.option(
            "--join-timeout", "join_timeout_s", type=FiniteFloat(positive=True),
            default=JOIN_TIMEOUT_S, show_default=True,
            help=f"Seconds to wait for every {member} to arrive.")(command)

    return decorate


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
@session_options("json", "out", "iterations")
@timeout_option
@_agent_wait_options("host")
@click.option("--no-ingress", is_flag=True, help="Shape egress only (no ifb on this host).")
@session_options("allow-untrusted")
@gate_options
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

    from netsim_ddp.run.folders import run_folder
    from netsim_ddp.run.hosts.host_agent import run_host
    from netsim_ddp.run.hosts.host_options import HostOptions

    (scenario,) = load_scenarios((file,))
    if scenario.workload is not None and scenario.workload.is_script:
        fail_command(f"{file}: workload.command: `host` runs the built-in loop only; run a script "
                     "on one host's emulated network with `netsim-ddp launch`", EXIT_BAD_INPUT)
    session = _agent_session(tolerances, baseline, alpha, save_baseline)
    # A folder of this agent's own, as for `run`: a reused --out never replays old files.
    folder = run_folder(Path(out_dir) if out_dir else None, secrets.token_hex(3)).resolve()
    options = HostOptions(
        scenario=scenario, node_rank=node_rank, nnodes=nnodes, master_addr=master_addr,
        master_port=master_port, nic=nic, iterations=iterations, timeout_s=timeout_s,
        out_dir=folder, join_timeout_s=join_timeout_s, heartbeat_timeout_s=heartbeat_timeout_s,
        allow_untrusted=allow_untrusted, ingress=not no_ingress)
    _run_agent(lambda: run_host(options, progress=lambda message: err.print(escape(message))),
               scenario, session, json_out, first=node_rank == 0,
               member=options.node_name, leader="node 0",
               temporary=None if out_dir else folder)


def _agent_session(tolerances: tuple[str, ...], baseline: str | None, alpha: float,
                   save_baseline: str | None):
    from netsim_ddp.run.session import NetsimSession, SessionOptionError

    try:
        session = NetsimSession.create(
            tolerances=list(tolerances) or None, baseline=baseline, alpha=alpha,
            save_baseline=Path(save_baseline) if save_baseline else None)
    except SessionOptionError as exc:
        fail_command(str(exc), EXIT_BAD_INPUT)
    for warning in session.warnings:
        err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
    return session


@main.command()
@click.argument("file")
@click.option("--machine-rank", type=click.IntRange(min=0), required=True,
              help="This machine's index (0: it hosts the job, node 0 and the results).")
@click.option("--machines", type=click.IntRange(min=1), required=True,
              help="Machines in the job; each holds a contiguous share of the nodes.")
@click.option("--master-addr", required=True, help="Machine 0's address, reachable by all.")
@click.option("--master-port", type=click.IntRange(1, 65535), required=True,
              help="Machine 0's port for the job's c10d store.")
@click.option("--nic", required=True, help="This machine's NIC to the others: the VXLAN's "
              "underlay (MTU at least link.mtu + 50; nothing on it is changed).")
@session_options("json", "out", "iterations")
@timeout_option
@_agent_wait_options("machine")
@session_options("allow-untrusted")
@gate_options
def machine(file: str, machine_rank: int, machines: int, master_addr: str, master_port: int,
            nic: str, json_out: str | None, out_dir: str | None, iterations: int | None,
            timeout_s: float | None, join_timeout_s: float, heartbeat_timeout_s: float,
            allow_untrusted: bool, baseline: str | None, save_baseline: str | None,
            tolerances: tuple[str, ...], alpha: float) -> None:
    """Be one machine of a scale model spread over several (srun, a Kubernetes Indexed Job):
    builds this machine's share of the emulated nodes, joins its switch to the others' over
    --nic (VXLAN), trains at the job's dilation; machine 0 reports as `run` does."""
    import secrets

    from netsim_ddp.run.folders import run_folder
    from netsim_ddp.run.hosts.machine_agent import MachineOptions, run_machine

    (scenario,) = load_scenarios((file,), host_check=False)  # the agent checks this machine's share
    session = _agent_session(tolerances, baseline, alpha, save_baseline)
    folder = run_folder(Path(out_dir) if out_dir else None, secrets.token_hex(3)).resolve()
    options = MachineOptions(
        scenario=scenario, machine_rank=machine_rank, machines=machines,
        master_addr=master_addr, master_port=master_port, nic=nic, iterations=iterations,
        timeout_s=timeout_s, out_dir=folder, join_timeout_s=join_timeout_s,
        heartbeat_timeout_s=heartbeat_timeout_s, allow_untrusted=allow_untrusted)
    _run_agent(lambda: run_machine(options, progress=lambda message: err.print(escape(message))),
               scenario, session, json_out, first=machine_rank == 0,
               member=f"machine {machine_rank}", leader="machine 0",
               temporary=None if out_dir else folder)


def _run_agent(run: Callable[[], Any], scenario, session, json_out: str | None, *, first: bool,
               member: str, leader: str, temporary: Path | None) -> NoReturn:
    """`host` and `machine` alike: the agent's run, then the leader's report (and gate), or a
    follower's word that the job finished. `temporary`: the agent's folder when no --out named
    one, removed unless the run failed or erred."""
    from netsim_ddp.fabric import FabricError
    from netsim_ddp.run.folders import remove_when_done
    from netsim_ddp.run.hosts.host_options import HostConfigError, HostError
    from netsim_ddp.verdicts.scenario_report import ScenarioReport
    from netsim_ddp.workload import WorkloadError

    human = human_console(json_out)
    try:
        outcome = run()
    except HostConfigError as exc:  # refused before anything changed or ran
        remove_when_done(temporary, "refused")
        fail_command(str(exc), EXIT_BAD_INPUT)
    except HostError as exc:
        if not first:
            remove_when_done(temporary, "error")
            fail_command(str(exc), EXIT_FAILED)
        outcome = ScenarioReport(scenario, error=str(exc))
    except (FabricError, WorkloadError) as exc:
        remove_when_done(temporary, "error")  # only if nothing was written there
        fail_command(str(exc), EXIT_FAILED)
    if isinstance(outcome, str):  # a follower: the verdict is the leader's to report
        out.print(f"{member}: job finished ({outcome}); {leader} reports the results")
        remove_when_done(temporary, outcome)
        sys.exit(exit_code([outcome]))
    if outcome.error:
        err.print(f"[red]{scenario.name}: error[/]: {escape(outcome.error)}", soft_wrap=True)
    elif outcome.refused:
        human.print(f"[yellow]{scenario.name}: UNTRUSTED[/]: {escape(outcome.untrusted_reason)}")
    else:
        if session.baseline is not None:
            outcome.checks.extend(session.gate(outcome))
        _print_report(human, outcome)
    if remove_when_done(temporary, outcome.status):
        outcome.out_dir = None
    session.reports.append(outcome)
    session.finish()
    write_json(json_out, session.document().dump())
    sys.exit(exit_code([outcome.status]))


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
    scenario, = load_scenarios((file,))
    if scenario.workload is None:
        fail_command(f"{file}: workload: required to profile compute", 2)
    assert scenario.workload is not None
    import torch

    from netsim_ddp.workload.ranks.compute_profiler import profile_compute

    torch.set_num_threads(threads)
    profile = profile_compute(scenario.workload, mode_name=mode_name, steps=steps,
                              warmup=warmup, device=torch.device(device) if device else None,
                              progress=click.echo)
    Path(out_path).write_text(profile.model_dump_json(indent=1), encoding="utf-8")
    click.echo(f"{out_path}: {profile.model} on {profile.device}: forward + backward median "
               f"{profile.compute_s * 1e3:.1f} ms (step-to-step cv {profile.spread:.3f}), "
               f"{len(profile.layers)} layers; use it as workload.profile")


def _start_session(tolerances, baseline, alpha, save_baseline, iterations, out_dir,
                   allow_untrusted, timeout_s, history_dir):
    """`run` and `launch`: the session of runs from the shared options, its warnings, and the
    network privilege (root, or the user namespace) before anything is built."""
    from netsim_ddp.fabric import PrivilegeError, ensure_network_privilege
    from netsim_ddp.run.session import NetsimSession, SessionOptionError

    try:
        session = NetsimSession.create(
            tolerances=list(tolerances) or None, baseline=baseline, alpha=alpha,
            save_baseline=Path(save_baseline) if save_baseline else None,
            iterations=iterations, out_dir=Path(out_dir) if out_dir else None,
            allow_untrusted=allow_untrusted, timeout_s=timeout_s,
            history_dir=Path(history_dir) if history_dir else None)
    except SessionOptionError as exc:
        fail_command(str(exc), EXIT_BAD_INPUT)
    for warning in session.warnings:
        err.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
    _warn_about_stale_runs()
    try:
        ensure_network_privilege()
    except PrivilegeError as exc:
        fail_command(str(exc), EXIT_FAILED)
    return session


def _warn_about_stale_runs() -> None:
    """Namespaces or processes of killed runs load the host and blur this run's numbers."""
    from netsim_ddp.fabric.stale import clean_stale_runs

    stale = clean_stale_runs(dry_run=True)  # only looks
    if stale.harmful:
        err.print(f"[yellow]warning:[/] {escape(stale.describe())}; they can load this host "
                  "and distort the results: `netsim-ddp clean` removes them (live runs are "
                  "spared)", soft_wrap=True)
