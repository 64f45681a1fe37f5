"""What `netsim-ddp plan` prints about fitting a scale model: on this host, and in machines of a
kind (scenario.sizing)."""

from __future__ import annotations

from rich.table import Table

from netsim_ddp.scenario.limits import HostResources, check_host
from netsim_ddp.scenario.rank_costs import (
    CPU_BUDGET,
    MEMORY_BUDGET,
    bytes_per_param,
    scenario_cores,
    scenario_memory_bytes,
)
from netsim_ddp.scenario.sizing import MachineSpec, Sizing
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.units import format_size


def _dilation(scenario: Scenario) -> float | None:
    emulation = scenario.emulation
    if emulation is None:
        return 1.0
    return None if emulation.auto else float(emulation.dilation)  # type: ignore[arg-type]


def host_fit(scenario: Scenario, host: HostResources) -> tuple[bool, list[str]]:
    """Whether this host holds the scenario (scenario.limits), and the lines that say why and
    whether its CPU is likely to keep up (rank_costs; gloo ranks only)."""
    processes, models = scenario_memory_bytes(scenario)
    machine = MachineSpec.this_host(host.memory_bytes)
    lines = [f"memory: about {format_size(processes + models)} ({format_size(processes)} "
             f"for the processes, {format_size(models)} for the models at "
             f"{bytes_per_param(scenario)} bytes per parameter per rank) of this host's "
             f"{format_size(host.memory_bytes)}"]
    fits = True
    try:
        check_host(scenario, host)
    except ScenarioError as exc:
        fits = False
        lines.append(f"refused here: {exc}")
    k = _dilation(scenario)
    workload = scenario.workload
    if workload is not None and k is not None and workload.backend != "nccl":
        # Advice, not a refusal: the fidelity probe is what decides whether the host kept up.
        cores = scenario_cores(scenario, k)
        budget = machine.cores * CPU_BUDGET
        lines.append(f"CPU at x{k:g}: the ranks keep about {cores:.2f} of {machine.cores} cores "
                     f"busy while they all-reduce (budget {budget:g}: "
                     + ("within it)" if cores <= budget else "over it: expect the fidelity "
                        "probe to refuse; raise emulation.dilation)"))
    lines.append("fits this host's memory and limits" if fits
                 else "does NOT fit this host")
    return fits, lines


def sizing_table(sizing: Sizing, this_k: float | None) -> Table:
    node = sizing.node
    table = Table(title=f"{sizing.scenario}: {sizing.ranks} ranks in {sizing.nodes} nodes on "
                  f"machines of {sizing.machine.describe()}",
                  caption=f"a node: {format_size(node.memory_bytes)} of memory, "
                  f"{node.cores(1.0):.2f} cores at x1 (/ k); a machine may use "
                  f"{MEMORY_BUDGET:.0%} of its memory and keep {CPU_BUDGET:.0%} of its cores "
                  "busy; host time per target second = k")
    for column in ("dilation", "nodes per machine", "bound by", "machines",
                   "cores busy per machine"):
        table.add_column(column, justify="right")
    for row in sizing.rows:
        mark = " (scenario)" if row.dilation == this_k else ""
        table.add_row(f"x{row.dilation:g}{mark}", str(row.nodes_per_machine), row.bound_by,
                      str(row.machines) if row.machines else "none fits",
                      f"{row.cores_demanded:.1f}")
    return table


def sizing_summary(sizing: Sizing, this_k: float | None) -> str:
    parts = []
    if this_k is not None:
        row = sizing.rows[[r.dilation for r in sizing.rows].index(this_k)]
        parts.append(f"at the scenario's x{this_k:g}: " + (
            f"{row.machines} machine(s) of {row.nodes_per_machine} nodes"
            if row.machines else "no machine of this kind holds one node"))
    parts.append(f"on one machine from x{sizing.least_k_one_machine:g}"
                 if sizing.least_k_one_machine is not None else
                 "never on one machine (its memory holds "
                 f"{sizing.rows[-1].nodes_per_machine} of {sizing.nodes} nodes)")
    return "; ".join(parts)


__all__ = ["host_fit", "sizing_summary", "sizing_table"]
