"""A user's script in a scale model: what `netsim-ddp launch` keeps of a scale model's
workload, and what it refuses before anything is built.

A time-dilated script must have its compute replayed ([workload] compute or profile): its CPU
compute would otherwise run at the host's speed and count 1/k in the target's time, a number
about nothing. The replay itself (workload.script_replay) replaces the compute of the module
the script hands to DDP; its layout is the script's own model, so a shipped `layout` does not
apply. No torch here.
"""

from __future__ import annotations

from netsim_ddp.scenario.workload import WorkloadConfig

# What a scale model's [workload] says about the target's compute: kept when `launch` runs a
# script in it (the built-in loop's model, layout and modes are dropped).
SCRIPT_REPLAY_FIELDS = ("compute", "compute_amp", "amp_ratio", "optimizer", "forward_fraction",
                        "profile", "noise")


def check_script_scale_model(dilation: float | str, workload: WorkloadConfig) -> None:
    """Raise ValueError (naming the field and the fix) for a script the scale model cannot
    stand in for."""
    if dilation != 1 and not workload.replayed:
        raise ValueError(
            f"emulation.dilation: a script at dilation {dilation} computes on the host's CPU, "
            "and its compute would count 1/k of the host's time in the target's: set "
            "workload.compute (the target GPU's forward + backward per step, e.g. '230ms') or "
            "workload.profile, or run the script in real time (dilation = 1)")
