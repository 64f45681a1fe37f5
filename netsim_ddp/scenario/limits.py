"""What this host can hold: a scenario that asks for more is refused before anything is built.

The scenario model checks what no Linux host can do (a bridge's 1023 ports, tc's 32-bit queue
limit); this module checks what depends on the host: memory for the ranks and their model, the
queues' bytes, processes and network namespaces. A refusal is a `ScenarioError` naming the
field, what was asked and what this host has.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from netsim_ddp.scenario.rank_costs import bytes_per_param, scenario_memory_bytes
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.units import format_size

# A queued frame costs the kernel more than its bytes (sk_buff, page rounding): twice is a
# conservative truesize.
QUEUE_OVERHEAD = 2


@dataclass(frozen=True)
class HostResources:
    memory_bytes: int  # MemTotal, or the cgroup's memory.max where lower
    max_processes: int  # RLIMIT_NPROC and kernel.pid_max, the lower
    max_net_namespaces: int

    @classmethod
    def probe(cls) -> HostResources:
        return cls(_memory_bytes(), _max_processes(), _read_int(
            Path("/proc/sys/user/max_net_namespaces"), default=2**31 - 1))

    def describe(self) -> str:
        return (f"{format_size(self.memory_bytes)} of memory, {self.max_processes} processes, "
                f"{self.max_net_namespaces} network namespaces")


def check_host(scenario: Scenario, host: HostResources | None = None) -> None:
    """Raise ScenarioError if the scenario, or any point of its sweep, asks for more than this
    host has."""
    host = host or HostResources.probe()
    if scenario.sweep is None:
        _check_one(scenario, host, point=False)
        return
    for values in scenario.sweep.points():
        _check_one(scenario.at_sweep_point(values), host, point=True)


def _check_one(scenario: Scenario, host: HostResources, *, point: bool) -> None:
    topology = scenario.topology
    nodes, ranks = topology.nodes, topology.nodes * topology.ranks_per_node
    flows = len(scenario.background)
    asked = f"{nodes} nodes x {topology.ranks_per_node} ranks"

    def refuse(field: str, reason: str) -> None:
        if point:  # a sweep point: the sweep is what asked for it
            raise ScenarioError(scenario.path, "sweep.points",
                                f"at {scenario.name}: {field}: {reason}")
        raise ScenarioError(scenario.path, field, reason)

    # A node, its switch side and possibly a delay line: up to two namespaces, plus the switch.
    namespaces = 2 * nodes + 1
    if namespaces > host.max_net_namespaces:
        refuse("topology.nodes", f"{nodes} nodes need up to {namespaces} network namespaces; "
               f"this host allows {host.max_net_namespaces} (user.max_net_namespaces)")
    processes = (nodes + ranks if scenario.workload else 0) + 2 * flows
    if processes > host.max_processes:
        refuse("topology.ranks_per_node", f"{asked} and {flows} background flows need "
               f"{processes} processes; this host allows {host.max_processes}")

    queues = sum(scenario.link_for(i).queue_limit_bytes for i in range(nodes))
    queue_bytes = 2 * queues * QUEUE_OVERHEAD  # both directions of every link
    if queue_bytes > host.memory_bytes // 2:
        refuse("link.queue_limit", f"the queues of {nodes} links could hold "
               f"{format_size(queue_bytes)} of frames; this host has "
               f"{format_size(host.memory_bytes)} of memory (at most half of it for queues)")

    if scenario.workload is None:
        return
    # What the ranks really hold (rank_costs, measured): a replayed rank only DDP's buckets.
    base, model = scenario_memory_bytes(scenario)
    if base > host.memory_bytes:
        refuse("topology.ranks_per_node", f"{asked} ({ranks} ranks, {nodes} torchrun agents) "
               f"need about {format_size(base)} before any model; this host has "
               f"{format_size(host.memory_bytes)} of memory")
    if base + model > host.memory_bytes:
        held = "DDP's buckets" if scenario.workload.replayed else "weights, gradients, state"
        refuse("workload.params", f"{ranks} ranks of a {scenario.workload.params:,}-parameter "
               f"model need about {format_size(base + model)} ({bytes_per_param(scenario)} "
               f"bytes per parameter per rank: {held}; {format_size(base)} for the "
               f"processes); this host has {format_size(host.memory_bytes)} of memory (see "
               "`netsim-ddp plan --machine` for how many machines it needs)")


def _memory_bytes() -> int:
    total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = total or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cgroup = _read_int(Path("/sys/fs/cgroup/memory.max"), default=total)
    return min(total, cgroup)


def _max_processes() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    pid_max = _read_int(Path("/proc/sys/kernel/pid_max"), default=2**22)
    return pid_max if soft == resource.RLIM_INFINITY else min(soft, pid_max)


def _read_int(path: Path, default: int) -> int:
    """An integer from a /proc or /sys file; its default when absent or 'max'."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default
