"""The training side: what each rank runs (modes, models, the measured loop) and how torchrun
starts it on every emulated node. Importing this package does not import torch; only the ranks
(rank.py and what it imports) do.
"""

from netsim_ddp.precision.modes import MODES, Mode, get_mode, register_mode
from netsim_ddp.scenario.workload import RankSpec, WorkloadConfig
from netsim_ddp.workload.launcher.launch import Node, WorkloadError, launch, torchrun_argv
from netsim_ddp.workload.launcher.results import ModeResult, RankSamples, read_result

__all__ = [
    "MODES",
    "Mode",
    "ModeResult",
    "Node",
    "RankSamples",
    "RankSpec",
    "WorkloadConfig",
    "WorkloadError",
    "get_mode",
    "launch",
    "read_result",
    "register_mode",
    "torchrun_argv",
]
