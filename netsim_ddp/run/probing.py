"""The all-reduce probe's attempts before training: each attempt judged against the slowest
link, in launches of its own or gated inside the training launch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from netsim_ddp.common.metrics import ring_allreduce_lower_bound, summarize
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.hostfacts.hostload import CpuLoad
from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.precision.modes import (
    get_mode,
)
from netsim_ddp.run.site import Launcher, Progress
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.workload import AllreduceProbe
from netsim_ddp.workload import RankSpec, WorkloadError
from netsim_ddp.workload.ranks.collective import (
    AGAIN,
    TRAIN,
    attempt_dir,
    busbw_samples,
    give_verdict,
    read_probe,
)
from netsim_ddp.workload.ranks.collective import RESULT_FILE as PROBE_RESULT_FILE

PROBE_MIN_BYTES = 8 * 2**20


PROBE_MAX_BYTES = 64 * 2**20


def _probe_results(out: Path, dtypes: Sequence[str]) -> tuple[dict[str, float], list]:
    """Each dtype's median bus bandwidth from one probe attempt, and the attempt's results
    as read; a missing file, dtype or
    timing is an error, never a bandwidth (a zero duration would read as infinitely fast)."""
    try:
        results = read_probe(out)
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"the all-reduce probe left no readable result in {out}: {exc}") \
            from None
    by_dtype: dict[str, float] = {}
    for result in results:
        if not result.seconds or not all(0 < s < math.inf for s in result.seconds):
            raise WorkloadError(f"the all-reduce probe timed {result.dtype} as {result.seconds} "
                                "s: no usable measurement")
        if not result.at_job_size:
            by_dtype[result.dtype] = summarize(busbw_samples(result)).median
    if missing := [dtype for dtype in dtypes if dtype not in by_dtype]:
        raise WorkloadError(f"the all-reduce probe reported nothing for {', '.join(missing)} "
                            f"(asked {', '.join(dtypes)})")
    return by_dtype, results


class ProbeAttempts:
    """The all-reduce probe's attempts and their verdict: attempt after attempt until one
    reaches fidelity.min_fraction or none are left. `workload`: with the backend resolved."""

    def __init__(self, scenario: Scenario, workload, attempts: int | None = None,
                 job_sizes: Sequence[int] = ()):
        size = min(max(workload.params * 4, PROBE_MIN_BYTES), PROBE_MAX_BYTES)
        # A script's wire dtype is its own business: the probe times float32.
        self.dtypes = (["float32"] if workload.is_script else
                       list(dict.fromkeys(get_mode(mode).wire_dtype for mode in workload.modes)))
        self.probe = AllreduceProbe.model_validate({"size_bytes": size, "dtypes": self.dtypes,
                                                    "job_sizes": list(job_sizes)})
        _, goodput = slowest_link_goodput(scenario)
        world = scenario.topology.nodes * scenario.topology.ranks_per_node
        self.fidelity = CollectiveFidelity(size, world, [], goodput,
                                           scenario.fidelity.min_fraction)
        self.limit = attempts or scenario.fidelity.attempts
        # Generous: every dtype's and job size's timed all-reduces (and warm-up) at 20x the
        # ideal ring time.
        ideal = ring_allreduce_lower_bound(size * len(self.dtypes) + sum(job_sizes), world,
                                           goodput)
        self.attempt_timeout_s = 20 * ideal * (self.probe.warmup + self.probe.iterations)
        self.name = scenario.name

    def judge(self, attempt_out: Path) -> bool:
        """Read one attempt's results into the fidelity; True once no attempt is to follow
        (this one reached min_fraction, or went over the cap, or it was the last)."""
        by_dtype, results = _probe_results(attempt_out, self.dtypes)
        fidelity = self.fidelity
        fidelity.host_load = next((CpuLoad(**r.host_load) for r in reversed(results)
                                   if r.host_load), None)
        fidelity.dtype_bps.append(by_dtype)
        fidelity.job_size_bps.append({r.size_bytes: summarize(busbw_samples(r)).median
                                      for r in results if r.at_job_size})
        fidelity.attempts_bps.append(min(by_dtype.values()))
        # More attempts cannot undo an overshoot.
        reached = fidelity.fraction >= fidelity.min_fraction
        return reached or len(fidelity.attempts_bps) >= self.limit

    def retrying(self) -> str:
        return (f"{self.name}: all-reduce probe attempt {len(self.fidelity.attempts_bps) + 1} of "
                f"{self.limit} (so far {self.fidelity.fraction:.0%} of the link)")


def probe_collective(launcher: Launcher, scenario: Scenario, out: Path,
                     timeout_s: float | None, progress: Progress,
                     watchdog: Callable[[], None] | None = None, *, workload=None,
                     attempts: int | None = None, job_sizes: Sequence[int] = (),
                     ) -> CollectiveFidelity:
    """The probe in launches of its own, one per attempt (where the launcher cannot hold the
    training back while the harness judges it: multi-host, and NCCL, whose transport is read
    from the probe launch's finished logs). `workload`: with the backend resolved (default:
    the scenario's)."""
    workload = workload or scenario.workload
    assert workload is not None  # only a training scenario is probed
    probing = ProbeAttempts(scenario, workload, attempts, job_sizes)
    spec = RankSpec(workload=workload, modes=[], allreduce_probe=probing.probe)
    for attempt in range(probing.limit):
        if attempt:
            progress(probing.retrying())
        attempt_out = out / f"attempt{attempt}"
        launcher(spec, attempt_out, timeout_s or 90 + probing.attempt_timeout_s,
                 watchdog=watchdog)
        if probing.judge(attempt_out):
            break
    return probing.fidelity


class ProbeRefused(Exception):
    """Raised from the launch's watchdog: the host cannot drive the links; the launch ends."""


class ProbeGate:
    """The probe inside the training launch (RankSpec.probe_gated), one start-up instead of two:
    called with the launch's watchdog, it judges each attempt as its results appear and tells
    the ranks to probe again or to train, or ends the launch (ProbeRefused) when the host
    cannot drive the links and the run may not go on untrusted."""

    def __init__(self, probing: ProbeAttempts, launch_out: Path, allow_untrusted: bool,
                 progress: Progress, on_train: Callable[[], None]):
        self.probing, self.launch_out = probing, launch_out
        self.allow_untrusted, self.progress, self.on_train = allow_untrusted, progress, on_train
        self.decided = False

    def __call__(self) -> None:
        if self.decided:
            return
        # the next attempt to judge: one per attempt judged so far
        folder = attempt_dir(self.launch_out, len(self.probing.fidelity.attempts_bps))
        if not (folder / PROBE_RESULT_FILE).exists():
            return
        if not self.probing.judge(folder):
            self.progress(self.probing.retrying())
            give_verdict(folder, AGAIN)
            return
        self.decided = True
        if not (self.probing.fidelity.trusted or self.allow_untrusted):
            raise ProbeRefused(self.probing.fidelity.reason)
        self.on_train()
        give_verdict(folder, TRAIN)
