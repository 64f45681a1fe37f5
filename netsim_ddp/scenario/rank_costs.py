"""What a scenario's ranks cost a host: memory per node and per rank, and CPU at a dilation k.

Measured on this project's 2-core hosts by `bench/rank_costs.py` (docs/scale-model.md, "What a
rank costs"), torch 2.13 CPU, gloo:

- a node's agent (workload/agent.py) imports torch, torch._dynamo and the rank module once:
  304 MiB resident. Its ranks are forked from it and share those pages: a rank's own memory
  before its model is ~10-15 MiB (resident 239 MiB, proportional 52 MiB with 4 ranks);
- a replayed rank's model is DDP's buckets only (its parameters are the kernel's zero page):
  4 bytes per parameter, touched at the first step; a 16-bit compression hook (amp-fp16) adds
  its 2-byte copy of each bucket; gloo and the allocator ~30 MiB more (ResNet-50: +112 MiB
  fp32, +176 MiB amp-fp16 at the first step; VGG-16: +562 MiB fp32);
- a rank that computes holds weights, gradients, momentum, buckets (4 bytes each) and
  autocast's 16-bit copies: 20 bytes per parameter, and (torchrun on a GPU host, not forked) a
  whole process of its own;
- in real runs (8 and 16 ranks of ResNet-50, fp32 and amp-fp16, sampled) every rank and agent
  together held 326-331 MiB of PSS per rank: with the buckets deducted, ~100-105 MiB per rank
  of its own (it copies the agent's pages it writes, refcounts included);
- the host's CPU goes to moving the ranks' bytes (gloo over TCP through veths and tc): this
  host saturated its 2 cores at ~10.4 Gbit/s of rank sends (2 ranks at 10 Gbit/s: probe 52%),
  and the probe trusts a scale model whose ranks demand at most about half the cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from netsim_ddp.precision.modes import get_mode
from netsim_ddp.scenario.spec import Scenario

MiB, GiB = 2**20, 2**30
AGENT_BYTES = 320 * MiB  # a node's agent: torch imported once, shared with its forked ranks
# A forked rank's own pages before its buckets: ~12 MiB at start, gloo's ~30 MiB, and the
# agent's pages it copies as it runs (refcounts write to shared objects): 100-105 MiB in real
# runs of 8 and 16 ranks (bench/rank_costs.py scaling: all processes' PSS, buckets deducted).
FORKED_RANK_BYTES = 112 * MiB
PROCESS_BYTES = 224 * MiB  # a process that imports torch by itself (torchrun's ranks, NCCL)
REPLAY_BYTES_PER_PARAM = 4  # DDP's fp32 buckets; the parameters are the zero page
HOOK_BYTES_PER_PARAM = 2  # a 16-bit compression hook's copy of each bucket
COMPUTE_BYTES_PER_PARAM = 4 * 4 + 2 * 2  # weights, grads, momentum, buckets; 16-bit copies
FLOW_BYTES = 2 * 40 * MiB  # a background flow: a sender and a receiver, no torch
# Host CPU per bit a rank sends (gloo, TCP, veth, tc): 2 cores saturated at ~10.4 Gbit/s.
CPU_S_PER_BIT = 2 / 10.4e9
CPU_BUDGET = 0.5  # the share of a machine's cores the ranks may demand and still be trusted
MEMORY_BUDGET = 0.8  # the share of a machine's memory a scale model may plan to use


@dataclass(frozen=True)
class NodeCosts:
    """One emulated node's share of a host: its processes and its ranks' models."""

    process_bytes: int  # the agent (or torchrun) and the ranks' own pages
    model_bytes: int  # the ranks' models: buckets (replay) or everything (real compute)
    bits_per_s: float  # what its ranks send while all-reducing, at the target's link rate

    @property
    def memory_bytes(self) -> int:
        return self.process_bytes + self.model_bytes

    def cores(self, dilation: float) -> float:
        """Cores its ranks keep busy at dilation k, while the links run at rate / k."""
        return self.bits_per_s * CPU_S_PER_BIT / dilation


def _forked(scenario: Scenario) -> bool:
    """Ranks forked from one agent per node (gloo on the CPU: launch.torchrun_module); a replay
    always runs on gloo. 'auto' may mean NCCL (torchrun's own processes): charged as such."""
    workload = scenario.workload
    return workload is not None and (workload.replayed or workload.backend == "gloo")


def bytes_per_param(scenario: Scenario) -> int:
    workload = scenario.workload
    if workload is None:
        return 0
    if not workload.replayed or workload.is_script:  # a script's model, optimizer and all are
        return COMPUTE_BYTES_PER_PARAM                 # real (only its compute is replayed)
    hooked = any(get_mode(name).wire_dtype != "float32" for name in workload.modes)
    return REPLAY_BYTES_PER_PARAM + (HOOK_BYTES_PER_PARAM if hooked else 0)


def node_costs(scenario: Scenario, node: int = 0) -> NodeCosts:
    """What node `node` of the scenario (the target's, not yet dilated) costs a host."""
    per_node = scenario.topology.ranks_per_node
    workload = scenario.workload
    if workload is None:
        return NodeCosts(0, 0, 0.0)
    if _forked(scenario):
        processes = AGENT_BYTES + per_node * FORKED_RANK_BYTES
    else:
        processes = (1 + per_node) * PROCESS_BYTES
    model = per_node * workload.params * bytes_per_param(scenario)
    # Every rank of a ring sends at its node's link rate while the all-reduce runs.
    return NodeCosts(processes, model, per_node * scenario.link_for(node).rate)


def scenario_memory_bytes(scenario: Scenario) -> tuple[int, int]:
    """(processes, models) of every node, plus background flows with the processes."""
    nodes = [node_costs(scenario, i) for i in range(scenario.topology.nodes)]
    flows = len(scenario.background) * FLOW_BYTES
    return sum(n.process_bytes for n in nodes) + flows, sum(n.model_bytes for n in nodes)


def scenario_cores(scenario: Scenario, dilation: float) -> float:
    return sum(node_costs(scenario, i).cores(dilation) for i in range(scenario.topology.nodes))


def least_dilation(cores_at_k1: float, cores: int) -> float:
    """The least power of two k at which `cores_at_k1 / k` stays within the CPU budget."""
    if cores_at_k1 <= 0:
        return 1.0
    return float(2 ** max(0, math.ceil(math.log2(cores_at_k1 / (cores * CPU_BUDGET)))))


__all__ = ["AGENT_BYTES", "CPU_BUDGET", "CPU_S_PER_BIT", "FORKED_RANK_BYTES",
           "MEMORY_BUDGET", "NodeCosts", "PROCESS_BYTES", "bytes_per_param", "least_dilation",
           "node_costs", "scenario_cores", "scenario_memory_bytes"]
