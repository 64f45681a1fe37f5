"""Where a scenario's ranks run: which backend, which GPU each rank gets, and each node's
environment. Decided once by the harness, before any network exists, so `plan` can show it,
the JSON records it, and a run that cannot use what it asks for is refused with the reason
instead of failing inside a rank."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netsim_ddp.hostfacts import nccl
from netsim_ddp.hostfacts.gpus import GpuAssignment, GpuError, GpuInventory, assign_gpus, probe_gpus
from netsim_ddp.scenario.spec import Topology
from netsim_ddp.scenario.workload import WorkloadConfig

SHARED_GPU_NOTE = ("ranks sharing a GPU time-slice it: their compute and communication times "
                   "include waiting for each other's kernels, not only the network")


@dataclass(frozen=True)
class Placement:
    requested: str  # workload.backend: auto, gloo or nccl
    backend: str  # what the ranks use: gloo or nccl
    inventory: GpuInventory
    gpus: GpuAssignment | None = None  # None: the ranks run on the CPU
    refused: str | None = None  # why this host cannot run the scenario as asked
    note: str | None = None  # why 'auto' did not pick NCCL
    pinned: dict[str, str] | None = None  # NCCL settings the harness chose (ring, simple)

    def node_env(self, run_id: str, node_names: Sequence[str],
                 environ: Mapping[str, str] | None = None,
                 ifname: str = nccl.NODE_IFNAME) -> list[dict[str, str]]:
        """Per node, what its ranks get on top of the shared environment; `ifname`: the NIC
        NCCL must use between nodes."""
        environ = os.environ if environ is None else environ
        envs = []
        for index, name in enumerate(node_names):
            env: dict[str, str] = {}
            if self.gpus is not None:
                env |= self.gpus.env(index)
            if self.backend == "nccl":
                env |= nccl.merged_env(environ, run_id, name, ifname)
            envs.append(env)
        return envs

    def describe(self) -> str:
        if self.refused:
            return f"backend {self.requested}: refused on this host: {self.refused}"
        text = f"backend {self.backend}"
        if self.requested == "auto":
            text += " (auto" + (f": {self.note})" if self.note else ")")
        if self.backend == "nccl" and self.pinned:
            text += (" pinned to " + ", ".join(f"{k}={v}" for k, v in self.pinned.items())
                     + " (the bytes between nodes as the ring predicts; set them to choose)")
        text += f", {self.gpus.describe()}" if self.gpus else ", ranks on the CPU"
        if self.gpus is not None and self.gpus.shared:
            text += f"; {SHARED_GPU_NOTE}"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"requested": self.requested, "backend": self.backend,
                "gpus": self.gpus.as_dict() if self.gpus else None,
                "shared_gpus": bool(self.gpus and self.gpus.shared),
                "shared_gpu_note": SHARED_GPU_NOTE if self.gpus and self.gpus.shared else None,
                "host_gpus": self.inventory.as_dict(), "refused": self.refused,
                "note": self.note, "nccl_pinned": self.pinned, "summary": self.describe()}


def place(workload: WorkloadConfig, topology: Topology, inventory: GpuInventory | None = None,
          environ: Mapping[str, str] | None = None) -> Placement:
    """The backend and GPUs for `workload` on `topology` on this host (or `inventory`)."""
    environ = os.environ if environ is None else environ
    requested = workload.backend
    if requested == "gloo":
        return Placement(requested, "gloo", inventory or GpuInventory(0))
    if workload.replayed:  # replay's zero-page model lives on the CPU: no GPU to hand NCCL
        if requested == "auto":
            return Placement(requested, "gloo", inventory or GpuInventory(0),
                             note="compute replay keeps its model on the CPU: gloo")
        return Placement(requested, "nccl", inventory or GpuInventory(0), refused=(
            "workload.backend = 'nccl' with compute replay (workload.compute or profile): the "
            "replayed model stays on the CPU, which NCCL cannot reduce; set backend = 'gloo' "
            "or 'auto'"))
    inventory = inventory or probe_gpus()
    nodes, per_node = topology.nodes, topology.ranks_per_node
    if not inventory.nccl_usable:
        if requested == "auto":
            return Placement(requested, "gloo", inventory, note=inventory.missing)
        return Placement(requested, "nccl", inventory, refused=(
            f"workload.backend = 'nccl' needs CUDA GPUs and NCCL: {inventory.missing}"))
    try:
        gpus = assign_gpus(nodes, per_node, inventory.count, workload.share_gpus,
                           inventory.compute_modes)
    except GpuError as exc:
        if requested == "auto":
            return Placement(requested, "gloo", inventory, note=str(exc))
        return Placement(requested, "nccl", inventory, refused=str(exc))
    settings = nccl.refused_user_settings({k: v for k, v in environ.items()
                                           if k.startswith("NCCL_")})
    if settings:
        return Placement(requested, "nccl", inventory, gpus, refused=(
            "NCCL settings in the environment would break the emulation: "
            + "; ".join(settings)))
    return Placement(requested, "nccl", inventory, gpus,
                     pinned=nccl.pinned_by_harness(environ))
