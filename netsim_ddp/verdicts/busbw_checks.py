"""`fidelity:busbw`: did the links deliver the bus bandwidth of the user's nccl-tests file
(`[link] busbw_from`) at the job's bucket sizes?

The links were set from a fit (projection.busbw_links); this is the measurement: the
all-reduce probe's float32 all-reduce at each size, on the built links, in the target's time
(a scale model's bus bandwidth x k), against the file's at that size, within its TOLERANCE.
"""

from __future__ import annotations

from typing import Any

from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.scenario.target_busbw import TOLERANCE, TargetBusbw
from netsim_ddp.verdicts.gate import Verdict, host_verdict

NAME = "fidelity:busbw"


def measured_busbw(plan: TargetBusbw, fidelity: CollectiveFidelity | None,
                   dilation: float) -> dict[int, float]:
    """Each planned size's bus bandwidth as the probe measured it, target time (bits/s)."""
    found = fidelity.best_job_sizes if fidelity is not None else {}
    return {size: found[size] * dilation for size in plan.sizes if size in found}


def busbw_check(plan: TargetBusbw, fidelity: CollectiveFidelity | None,
                dilation: float) -> Verdict:
    measured = measured_busbw(plan, fidelity, dilation)
    if missing := [size for size in plan.sizes if size not in measured]:
        return host_verdict(NAME, False, f"the probe did not time {len(missing)} of the job's "
                            f"{len(plan.sizes)} bucket sizes, so nothing shows the links deliver "
                            f"{plan.file}'s bus bandwidth")
    parts, worst = [], 0.0
    for size in plan.sizes:
        error = measured[size] / plan.target_at(size) - 1
        worst = max(worst, abs(error))
        parts.append(f"{size / 2**20:.2f} MiB {measured[size] / 1e9:.3f} of "
                     f"{plan.target_at(size) / 1e9:.3f} Gbit/s ({error:+.1%})")
    passed = worst <= TOLERANCE
    verdict = (f"within {TOLERANCE:.0%}" if passed else
               f"off by up to {worst:.1%}, more than {TOLERANCE:.0%}: the emulated path does not "
               "carry the target's transport at these sizes (a host that cannot drive the "
               "delay line, or a file whose curve one rate and one latency cannot follow)")
    return host_verdict(NAME, passed, f"bus bandwidth at the job's bucket sizes against "
                        f"{plan.file}: " + "; ".join(parts) + f": {verdict}")


def busbw_record(plan: TargetBusbw | None, fidelity: CollectiveFidelity | None,
                 dilation: float) -> dict[str, Any] | None:
    """The plan and what the probe measured at each size (target time), for the results."""
    if plan is None:
        return None
    measured = measured_busbw(plan, fidelity, dilation)
    record = plan.as_dict()
    for row in record["sizes"]:
        row["measured_busbw_bps"] = measured.get(row["size_bytes"])
    return record
