"""How many machines of a kind a scale model needs, at which dilation: from what its nodes cost
(rank_costs, measured on this project's hosts).

A machine holds whole emulated nodes (a node's ranks share one agent and one namespace). At
dilation k it holds as many as both its memory (MEMORY_BUDGET of it) and its cores (the
ranks may keep CPU_BUDGET of them busy, at link rates / k) allow; the model then needs
ceil(nodes / that) machines. Memory does not shrink with k; CPU does, and the run's host time
grows by k: the table is that trade.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netsim_ddp.scenario.rank_costs import (
    CPU_BUDGET,
    MEMORY_BUDGET,
    NodeCosts,
    least_dilation,
    node_costs,
)
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.units import Size, format_size

MACHINE_FORM = "cores=16,memory=64GiB"
_PAIR = re.compile(r"^\s*([a-z_]+)\s*=\s*(\S+)\s*$")


class MachineSpec(BaseModel):
    """One kind of machine the scale model may run on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cores: int = Field(ge=1, description="CPU cores the scale model may use.")
    memory: Size = Field(gt=0, description="Memory, e.g. '64GiB'.")

    @classmethod
    def parse(cls, text: str) -> MachineSpec:
        """'cores=16,memory=64GiB' -> MachineSpec; ValueError naming the part and the fix."""
        fields: dict[str, str] = {}
        for part in text.split(","):
            match = _PAIR.match(part)
            if not match:
                raise ValueError(f"machine {text!r}: {part.strip()!r} is not NAME=VALUE; "
                                 f"write it as {MACHINE_FORM!r}")
            if match[1] in fields:
                raise ValueError(f"machine {text!r}: {match[1]} given twice (write it as "
                                 f"{MACHINE_FORM!r})")
            fields[match[1]] = match[2]
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'machine'}: {e['msg']}"
                                 for e in exc.errors())
            raise ValueError(f"machine {text!r}: {problems} (write it as "
                             f"{MACHINE_FORM!r})") from None

    @classmethod
    def this_host(cls, memory_bytes: int) -> MachineSpec:
        return cls(cores=len(os.sched_getaffinity(0)), memory=memory_bytes)

    def describe(self) -> str:
        return f"{self.cores} cores, {format_size(self.memory)}"


@dataclass(frozen=True)
class SizingRow:
    dilation: float
    nodes_per_machine: int  # 0: not even one node fits a machine
    bound_by: str  # 'memory', 'CPU' or 'nodes' (all of them fit)
    machines: int | None  # None: no machine of this kind holds one node
    cores_demanded: float  # by the busiest machine's ranks, at this k
    host_s_per_target_s: float  # k: the run's wall time per second of the target's


@dataclass(frozen=True)
class Sizing:
    scenario: str
    nodes: int
    ranks: int
    machine: MachineSpec
    node: NodeCosts  # the costliest node
    rows: tuple[SizingRow, ...]
    least_k_one_machine: float | None  # the least power of two at which one machine holds all

    def row_at(self, dilation: float) -> SizingRow:
        for row in self.rows:
            if row.dilation == dilation:
                return row
        raise KeyError(dilation)


def _costliest(scenario: Scenario) -> NodeCosts:
    costs = [node_costs(scenario, i) for i in range(scenario.topology.nodes)]
    return NodeCosts(max(c.process_bytes for c in costs), max(c.model_bytes for c in costs),
                     max(c.bits_per_s for c in costs))


def size_row(scenario: Scenario, machine: MachineSpec, dilation: float,
             node: NodeCosts | None = None) -> SizingRow:
    node = node or _costliest(scenario)
    nodes = scenario.topology.nodes
    by_memory = int(machine.memory * MEMORY_BUDGET // max(node.memory_bytes, 1))
    cores = node.cores(dilation)
    by_cpu = int(machine.cores * CPU_BUDGET // cores) if cores > 0 else nodes
    fit = min(by_memory, by_cpu, nodes)
    bound = "nodes" if fit == nodes else "memory" if by_memory <= by_cpu else "CPU"
    machines = math.ceil(nodes / fit) if fit else None
    return SizingRow(dilation, fit, bound, machines, min(fit, nodes) * cores, dilation)


def dilations_to_show(scenario: Scenario) -> list[float]:
    """Powers of two up to the scenario's max_dilation, and the scenario's own k."""
    emulation = scenario.emulation
    top = emulation.max_dilation if emulation is not None else 256.0
    ks = {float(2**i) for i in range(int(math.log2(top)) + 1)}
    if emulation is not None and not emulation.auto:
        ks.add(float(emulation.dilation))  # type: ignore[arg-type]
    return sorted(ks)


def size_machines(scenario: Scenario, machine: MachineSpec,
                  dilations: list[float] | None = None) -> Sizing:
    node = _costliest(scenario)
    rows = tuple(size_row(scenario, machine, k, node)
                 for k in (dilations or dilations_to_show(scenario)))
    nodes = scenario.topology.nodes
    one = None
    if node.memory_bytes * nodes <= machine.memory * MEMORY_BUDGET:
        one = least_dilation(node.cores(1.0) * nodes, machine.cores)
    return Sizing(scenario.name, nodes, nodes * scenario.topology.ranks_per_node, machine,
                  node, rows, one)


__all__ = ["MACHINE_FORM", "MachineSpec", "Sizing", "SizingRow", "dilations_to_show",
           "size_machines", "size_row"]
