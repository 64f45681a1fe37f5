"""GPUs for the ranks of emulated nodes: what this host has, and which rank gets which.

Emulated nodes are network namespaces of one host, so they share its GPUs. Each rank gets its
own GPU where the host has enough: node i's local rank r takes global index i x R + r (R ranks
per node). With fewer GPUs than ranks, ranks share GPUs only when the scenario says so
(`workload.share_gpus`), since shared compute changes the compute time; the result says so.
Two ranks of one node never share a GPU under NCCL: NCCL refuses two ranks of one host on one
GPU ("Multiple Ranks are using the same GPU", or "Duplicate GPU detected"), while ranks of
different nodes may, since each node is a host of its own to NCCL (NCCL_HOSTID).

The inventory is read in a child process: the harness never imports torch or initialises CUDA
itself (a CUDA context in the harness would hold memory on every GPU for the whole run).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

GPUS_ENV = "NETSIM_DDP_GPUS"  # per node: the global GPU index of each local rank, "0,1"
PROBE_TIMEOUT_S = 120.0

_PROBE = """
import json, subprocess, torch, torch.distributed as dist
count = torch.cuda.device_count() if torch.cuda.is_available() else 0
nccl = None
if count and dist.is_available() and dist.is_nccl_available():
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
modes = []
try:  # the compute mode decides whether ranks may share a GPU
    found = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    modes = [line.strip() for line in found.stdout.splitlines() if line.strip()]
except (OSError, subprocess.SubprocessError):
    pass
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "count": count,
                  "names": [torch.cuda.get_device_name(i) for i in range(count)],
                  "nccl": nccl, "compute_modes": modes if len(modes) == count else []}))
"""
EXCLUSIVE_MODES = ("Exclusive_Process", "Exclusive_Thread", "Prohibited")


class GpuError(RuntimeError):
    """The scenario's ranks cannot be placed on this host's GPUs; says what is missing."""


@dataclass(frozen=True)
class GpuInventory:
    count: int
    names: tuple[str, ...] = ()
    torch: str | None = None
    cuda: str | None = None  # the CUDA version torch was built with
    nccl: str | None = None  # NCCL's version, when torch has it and a GPU is visible
    missing: str | None = None  # why the NCCL path cannot be used here (None: it can)
    compute_modes: tuple[str, ...] = ()  # per GPU, as nvidia-smi names it; () if unknown

    @property
    def nccl_usable(self) -> bool:
        return self.missing is None

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"nccl_usable": self.nccl_usable}


def _torch_lib() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _nvidia_devices() -> bool:
    return Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


@functools.lru_cache(maxsize=1)
def probe_gpus() -> GpuInventory:
    """What this host offers the NCCL path. Cheap where there is plainly no GPU (no NVIDIA
    device nodes, or a CPU-only torch): those are answered without starting Python."""
    lib = _torch_lib()
    if lib is None:
        return GpuInventory(0, missing="torch is not installed")
    if not (lib / "libtorch_cuda.so").exists():
        return GpuInventory(0, missing=f"torch is a CPU-only build (no {lib}/libtorch_cuda.so); "
                            "install a CUDA build of torch")
    if not _nvidia_devices():
        return GpuInventory(0, missing="no NVIDIA GPU is visible (no /dev/nvidia* devices)")
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return GpuInventory(0, missing=f"CUDA did not answer within {PROBE_TIMEOUT_S:g} s")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return GpuInventory(0, missing=f"torch could not query CUDA: {last}")
    return inventory_from(json.loads(done.stdout.strip().splitlines()[-1]))


def inventory_from(found: dict) -> GpuInventory:
    """The inventory from the child's answer, with what is missing for NCCL spelled out."""
    count = int(found["count"])
    missing = None
    if count == 0:
        missing = f"CUDA sees no GPU (torch {found['torch']}, CUDA {found['cuda']})"
    elif not found.get("nccl"):
        missing = f"torch {found['torch']} was built without NCCL"
    return GpuInventory(count, tuple(found.get("names", ())), found.get("torch"),
                        found.get("cuda"), found.get("nccl"), missing,
                        tuple(found.get("compute_modes", ())))


@dataclass(frozen=True)
class GpuAssignment:
    """devices[node][local_rank] -> the host's GPU index (as CUDA numbers them)."""

    devices: tuple[tuple[int, ...], ...]
    gpus: int  # on the host

    @property
    def ranks(self) -> int:
        return sum(len(node) for node in self.devices)

    @property
    def shared(self) -> bool:
        """Some GPU serves more than one rank."""
        used = [gpu for node in self.devices for gpu in node]
        return len(set(used)) < len(used)

    def env(self, node: int) -> dict[str, str]:
        return {GPUS_ENV: ",".join(map(str, self.devices[node]))}

    def describe(self) -> str:
        text = f"{self.ranks} ranks on {self.gpus} GPUs"
        if self.shared:
            per_gpu = -(-self.ranks // self.gpus)
            text += (f", shared (up to {per_gpu} ranks per GPU: compute times include the "
                     "other ranks' work on the same GPU)")
        return text

    def as_dict(self) -> dict[str, object]:
        return {"devices": [list(node) for node in self.devices], "gpus": self.gpus,
                "shared": self.shared, "summary": self.describe()}


def assign_gpus(nodes: int, ranks_per_node: int, gpus: int, share: bool,
                compute_modes: tuple[str, ...] = ()) -> GpuAssignment:
    """Node i, local rank r -> GPU (i x R + r) mod G; raises GpuError if that would need
    sharing the scenario does not allow, two ranks of one node on one GPU, or sharing a GPU
    whose compute mode lets only one process use it."""
    ranks = nodes * ranks_per_node
    if gpus < 1:
        raise GpuError(f"{ranks} ranks need GPUs; this host has none")
    if gpus < ranks and not share:
        raise GpuError(
            f"{nodes} nodes x {ranks_per_node} ranks need {ranks} GPUs, one per rank; this host "
            f"has {gpus}. Set workload.share_gpus = true to let ranks of different nodes share "
            "GPUs (their compute times then include each other's work)")
    if gpus < ranks_per_node:
        raise GpuError(
            f"ranks_per_node = {ranks_per_node} needs {ranks_per_node} GPUs: NCCL cannot put "
            f"two ranks of one node on one GPU, and this host has {gpus}")
    assignment = GpuAssignment(tuple(tuple((node * ranks_per_node + local) % gpus
                                           for local in range(ranks_per_node))
                                     for node in range(nodes)), gpus)
    if assignment.shared:
        exclusive = [f"GPU {index} ({mode})" for index, mode in enumerate(compute_modes)
                     if mode in EXCLUSIVE_MODES]
        if exclusive:
            raise GpuError(
                f"{ranks} ranks would share {gpus} GPUs, but " + ", ".join(exclusive)
                + " lets only one process use it: set the compute mode to Default "
                "(nvidia-smi -c DEFAULT), or give every rank a GPU of its own")
    return assignment


def local_device_index(local_rank: int, environ: dict[str, str] | None = None) -> int:
    """Rank side: this rank's GPU, from the harness's assignment, else cuda:local_rank."""
    import os

    value = (environ if environ is not None else os.environ).get(GPUS_ENV)
    if not value:
        return local_rank
    devices = [int(part) for part in value.split(",")]
    if local_rank >= len(devices):
        raise GpuError(f"{GPUS_ENV}={value} names no GPU for local rank {local_rank}")
    return devices[local_rank]
