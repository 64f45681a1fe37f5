"""The training side, in three folders: launcher/ starts torchrun on every node (no torch),
ranks/ is what runs inside a rank (torch), contract/ is what both agree on: the result files,
the measured window's signals, the noise and the compute profile (no torch). Importing this
package does not import torch (tests/unit/test_layers.py checks it).
"""

from netsim_ddp.precision.modes import MODES, Mode, get_mode, register_mode
from netsim_ddp.scenario.workload import RankSpec, WorkloadConfig
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples, read_result
from netsim_ddp.workload.launcher.launch import LaunchNode, WorkloadError, launch, torchrun_argv

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
