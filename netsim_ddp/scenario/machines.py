"""A scale model spread over several machines (`netsim-ddp machine`): which emulated nodes each
machine holds, and what such a run refuses before anything changes. Pure: no kernel, no store.

Machine m holds a contiguous share of the nodes, the first `nodes % machines` machines one more
than the rest, so node 0 (whose rank 0 writes the results) is always on machine 0."""

from __future__ import annotations

from netsim_ddp.scenario.spec import Scenario


class MachineConfigError(ValueError):
    """The scenario cannot run across machines as asked; the message names the field and fix."""


def machine_share(nodes: int, machines: int, machine_rank: int) -> range:
    """The node indices machine `machine_rank` of `machines` holds."""
    if not 0 <= machine_rank < machines:
        raise MachineConfigError(f"--machine-rank {machine_rank} is outside 0..{machines - 1}")
    if machines > nodes:
        raise MachineConfigError(f"--machines {machines} is more than topology.nodes {nodes}: "
                                 "every machine holds at least one emulated node")
    base, extra = divmod(nodes, machines)
    start = machine_rank * base + min(machine_rank, extra)
    return range(start, start + base + (machine_rank < extra))


def check_machines(scenario: Scenario, machines: int) -> None:
    """Everything a multi-machine scale model refuses, named with its field and the fix."""
    where = scenario.path or scenario.name
    topology, link, workload = scenario.topology, scenario.link, scenario.workload
    machine_share(topology.nodes, machines, 0)  # more machines than nodes
    one_host = "run the scenario on one machine with `netsim-ddp run`"
    refusals = [
        (workload is None, "workload: required to run training; add a [workload] section"),
        (workload is not None and workload.is_script,
         f"workload.command: users' scripts across machines are not built yet; {one_host}"),
        (workload is not None and workload.backend == "nccl",
         "workload.backend = 'nccl': a scale model's ranks replay compute on the CPU over gloo; "
         "remove it"),
        (scenario.sweep is not None, f"sweep: sweeps run on one machine; {one_host}"),
        (scenario.emulation.auto, "emulation.dilation = 'auto': every machine must run the "
         "job's one k, chosen before the job: give a number (`netsim-ddp plan` sizes it)"),
        (bool(scenario.background), "background: flows across machines are not built yet; "
         f"{one_host}"),
        (bool(link.schedule), f"link.schedule: changing links across machines are not built "
         f"yet; {one_host}"),
        (topology.racks > 1, f"topology.racks: racks across machines are not built yet; "
         f"{one_host}"),
        (link.busbw_from is not None, f"link.busbw_from: its delay search runs on one machine; "
         f"{one_host}"),
        (any(scenario.link_for(i).impaired for i in range(topology.nodes)),
         "link delay, jitter or loss: the delay line's checks are per machine and not gathered "
         f"across machines yet; remove them, or {one_host}"),
    ]
    for refused, why in refusals:
        if refused:
            raise MachineConfigError(f"{where}: {why}")
