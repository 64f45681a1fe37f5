"""One host agent's options (`netsim-ddp host`), checked before anything changes, and where
its ranks run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from netsim_ddp.common.options import HEARTBEAT_TIMEOUT_S, JOIN_TIMEOUT_S
from netsim_ddp.hostfacts.gpus import GpuInventory
from netsim_ddp.hostfacts.placement import Placement, place
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload import WorkloadError


class HostError(WorkloadError):
    """The multi-host job cannot go on; the message names the host that failed or is missing."""


class HostConfigError(HostError):
    """Refused before anything changed: the scenario and the options disagree."""


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """What every agent of a job is given (`host`'s and `machine`'s): the scenario, where
    member 0 listens, this agent's NIC and folder, and how long to wait."""

    scenario: Scenario
    master_addr: str
    master_port: int
    nic: str
    out_dir: Path
    iterations: int | None = None
    timeout_s: float | None = None
    join_timeout_s: float = JOIN_TIMEOUT_S
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
    allow_untrusted: bool = False

    @property
    def reply_timeout_s(self) -> float:
        """How long member 0 waits for every member's word on a phase: a few heartbeats."""
        return 4 * self.heartbeat_timeout_s

    @property
    def members(self) -> int:
        """How many agents the job has (hosts, or machines)."""
        raise NotImplementedError

    def workload(self, backend: str) -> WorkloadConfig:
        """The scenario's workload as the ranks run it: --iterations, and the backend every
        agent resolved."""
        workload = self.scenario.workload
        assert workload is not None  # validated before any agent waits
        if self.iterations is not None:
            workload = workload.model_copy(update={"iterations": self.iterations})
        return workload.model_copy(update={"backend": backend})

    def digest(self) -> str:
        """What every agent must agree on: the scenario and the options that change the run."""
        text = json.dumps([self.scenario.model_dump(mode="json"), self.members, self.iterations,
                           self.allow_untrusted], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class HostOptions(AgentOptions):
    node_rank: int
    nnodes: int
    ingress: bool = True

    @property
    def members(self) -> int:
        return self.nnodes

    @property
    def node_name(self) -> str:
        return self.scenario.topology.node_names[self.node_rank]


def validate(options: HostOptions) -> None:
    """Everything that can be refused before anything on the host changes."""
    scenario, where = options.scenario, options.scenario.path or options.scenario.name
    if scenario.topology.nodes != options.nnodes:
        raise HostConfigError(
            f"{where}: topology.nodes is {scenario.topology.nodes} but --nnodes is "
            f"{options.nnodes}: one host per node; start {scenario.topology.nodes} agents, or "
            "change topology.nodes")
    if not 0 <= options.node_rank < options.nnodes:
        raise HostConfigError(f"--node-rank {options.node_rank} is outside 0..{options.nnodes - 1}")
    if scenario.workload is None:
        raise HostConfigError(f"{where}: workload: required to run training; add a [workload] "
                        "section (see README)")
    if scenario.sweep is not None:
        raise HostConfigError(f"{where}: sweep: sweeps run on one host only (`netsim-ddp run`)")
    if scenario.emulation.dilation != 1:
        raise HostConfigError(f"{where}: emulation.dilation: a time-dilated scale model runs on "
                              "one host (`netsim-ddp run`); real hosts' NICs run in real time: "
                              "remove it (compute replay alone works here)")
    if scenario.link.schedule:
        raise HostConfigError(f"{where}: link.schedule: links that change mid-run need the "
                              "harness's own switch; run the scenario with `netsim-ddp run`")
    if scenario.link.tcp.model_fields_set:  # fabric.tcp_clocks sets emulated nodes only
        raise HostConfigError(f"{where}: link.tcp: sets the emulated nodes' TCP; a real host's "
                              "TCP is its own (net.ipv4 sysctls): remove it, or run the "
                              "scenario with `netsim-ddp run`")
    if scenario.link.busbw_from is not None:  # sets and checks the emulated links only
        raise HostConfigError(f"{where}: link.busbw_from: shapes the emulated links to a "
                              "cluster's nccl-tests bus bandwidth; real hosts' links are "
                              "their own: remove it, or run the scenario with `netsim-ddp run`")


def host_placement(options: HostOptions, inventory: GpuInventory | None = None,
                   environ: Mapping[str, str] | None = None) -> Placement:
    """This host's backend and GPUs for its one node (its ranks_per_node ranks), as `run`
    decides them for a whole fabric; HostConfigError where this host cannot run it as asked
    (no GPUs for 'nccl', users' NCCL_* settings that would take the traffic off --nic)."""
    workload = options.scenario.workload
    assert workload is not None  # validated
    one_node = options.scenario.topology.model_copy(update={"nodes": 1, "names": None})
    placement = place(workload, one_node, inventory, environ)
    if placement.refused:
        raise HostConfigError(f"{options.scenario.path or options.scenario.name}: "
                              f"{placement.describe()}")
    return placement
