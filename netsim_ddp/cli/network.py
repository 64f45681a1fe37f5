"""Commands about this host and a scenario's network: check, validate, schema, plan, probe."""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from netsim_ddp.cli.app import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNTRUSTED,
    FiniteFloat,
    MachineParam,
    NetworkCommand,
    err,
    fail_command,
    human_console,
    load_scenarios,
    main,
    out,
    write_json,
)
from netsim_ddp.report.command_tables import (
    capability_table,
    fidelity_rows,
    fidelity_table,
    plan_table,
    rank_table,
)
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.units import format_rate


@main.command(cls=NetworkCommand)
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the result as JSON ('-': stdout).")
def check(json_out: str | None) -> None:
    """Print what this host can emulate; exit 1 if it can build nothing."""
    from netsim_ddp.fabric.capabilities import probe_capabilities, torch_status
    from netsim_ddp.hostfacts.gpus import probe_gpus

    caps = probe_capabilities()
    torch_info = torch_status()
    gpus = probe_gpus()
    table = capability_table(caps, torch_info, gpus)
    human_console(json_out).print(table)
    if caps.error:
        err.print(f"[red]{escape(caps.error)}[/]")
    if not caps.netem and caps.can_build:
        human_console(json_out).print(
            "netem is missing: delay, jitter and loss run through the userspace delay line"
            if caps.delay_line else
            f"netem is missing and the delay line cannot be built ({caps.delay_line_error}): "
            "scenarios with delay, jitter or loss cannot run here")
    write_json(json_out, {"capabilities": caps.as_dict(), "torch": torch_info,
                          "gpus": gpus.as_dict() | {"nccl_path": gpus.nccl_usable
                                                    and caps.can_build}})
    sys.exit(EXIT_OK if caps.can_build else EXIT_FAILED)


@main.command()
@click.argument("files", nargs=-1, required=True)
def validate(files: tuple[str, ...]) -> None:
    """Check scenario files (every sweep point, and against what this host can hold) without
    building anything; exit 2 on the first bad one."""
    for scenario in load_scenarios(files):
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


@main.command(cls=NetworkCommand)
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

    from netsim_ddp.fabric import FabricError
    from netsim_ddp.fabric.capabilities import probe_capabilities
    from netsim_ddp.fabric.plan import plan_fabric

    (scenario,) = load_scenarios((file,), host_check=False)
    subnet = scenario.topology.subnet or ipaddress.IPv4Network("10.128.0.0/24")
    impaired = any(scenario.link_for(i).impaired for i in range(scenario.topology.nodes))
    try:  # which delay backend applies depends on this host's kernel
        fabric_plan = plan_fabric(scenario, "000000", subnet,
                                  impaired and probe_capabilities().netem)
    except FabricError as exc:
        fail_command(f"{scenario.path}: {exc}", EXIT_FAILED)
    table = plan_table(scenario, fabric_plan)
    out.print(table)
    if scenario.workload is not None and not _print_placement(scenario, fabric_plan, gpus):
        sys.exit(EXIT_FAILED)
    if not _print_fit(scenario, machine):
        sys.exit(EXIT_FAILED)


def _print_fit(scenario: Scenario, machine) -> bool:
    """Whether this host holds the scenario; with a machine kind, how many it needs."""
    from netsim_ddp.report.sizing_tables import host_fit, sizing_summary, sizing_table
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
    from netsim_ddp.hostfacts.gpus import GpuInventory, probe_gpus
    from netsim_ddp.hostfacts.placement import place

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
    table = rank_table(scenario, fabric_plan, placement)
    out.print(table)
    envs = placement.node_env("<run>", [node.name for node in fabric_plan.nodes])
    for node, env in zip(fabric_plan.nodes, envs, strict=True):
        if env:
            out.print(f"{node.name} env: " + " ".join(f"{k}={v}" for k, v in env.items()),
                      soft_wrap=True)
    return True


@main.command(cls=NetworkCommand)
@click.argument("files", nargs=-1, required=True)
@click.option("--seconds", type=FiniteFloat(positive=True), default=None,
              help="Probe length (default: the scenario's).")
@click.option("--json", "json_out", metavar="OUT",
              help="Also write the result as JSON ('-': stdout).")
def probe(files: tuple[str, ...], seconds: float | None, json_out: str | None) -> None:
    """Build each scenario's network and check that this host can drive its links."""
    from netsim_ddp.fabric import Fabric, FabricError, PrivilegeError, ensure_network_privilege
    from netsim_ddp.fabric.fidelity import check_fidelity

    scenarios = load_scenarios(files)
    try:
        ensure_network_privilege()
    except PrivilegeError as exc:
        fail_command(str(exc), EXIT_FAILED)
    results, all_trusted = [], True
    table = fidelity_table()
    for scenario in scenarios:
        try:
            with err.status(f"{scenario.name}: building the network and probing its links"):
                with Fabric(scenario) as fabric:
                    report = check_fidelity(fabric, seconds)
        except FabricError as exc:
            fail_command(f"{scenario.path}: {exc}", EXIT_FAILED)
        all_trusted &= report.trusted
        fidelity_rows(table, scenario, report)
        results.append({"name": scenario.name, "file": str(scenario.path),
                        "fidelity": report.as_dict()})
        if not report.trusted:
            err.print(f"{scenario.name}: {report.reason}")
    human_console(json_out).print(table)
    write_json(json_out, {"scenarios": results})
    sys.exit(EXIT_OK if all_trusted else EXIT_UNTRUSTED)
