"""The training side, in two folders: launcher/ starts torchrun on every node and reads what
the ranks wrote (no torch), ranks/ is what runs inside a rank (torch). Importing this package
does not import torch (tests/unit/test_layers.py checks it).
"""

from netsim_ddp.precision.modes import MODES, Mode, get_mode, register_mode
from netsim_ddp.scenario.workload import RankSpec, WorkloadConfig
from netsim_ddp.workload.launcher.launch import LaunchNode, WorkloadError, launch, torchrun_argv
from netsim_ddp.workload.launcher.results import ModeResult, RankSamples, read_result

__all__ = [
    "MODES",
    "Mode",
    "ModeResult",
    "LaunchNode",
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
