"""Why the slow iterations were slow: for each one (common.tails), the rank that was last and
the cause the run's evidence names, and what share of the tail each cause explains.

The evidence, in order:
- compute: the ranks record their compute per step (a replay its schedule, noise and stalls
  included; real compute its compute-only step). When the slowest rank's compute lies above
  the job's typical compute by at least COMPUTE_EXPLAINS of the iteration's excess over the
  median iteration, compute was late: 'stall' when the replay drew a stall for that rank and
  step covering at least half of it (the scenario's seeded noise says so, workload.
  compute_noise), else 'compute' (a slow GPU, a slow episode, the light noise, real compute).
- timeout: the collective was slow and one of the job's own connections had a retransmission
  timeout inside the iteration's window (a CounterSeries 'job ... timeouts' that grew,
  fabric/counters/connection_sampler.py; where no connection was sampled, as when no background flow
  shares the nodes, a node's TCPTimeouts count: all of its connections are the job's). A
  timeout costs the target's RTO whatever the bytes: the part of the tail fewer bytes cannot
  shorten.
- network: otherwise the collective was slow. Its evidence: the TCP loss counters each node's
  local rank 0 read at the step's edges (RankSamples.step_tcp_loss: retransmissions, timeouts,
  loss probes in that node during the step), counter series sampled during the run
  (CounterSeries: the racks' uplink drops, fabric/counters/uplink_sampler.py) that grew inside the
  iteration's window, and a link change in force
  (link.schedule); without any, 'network' is named by elimination and says so.

No torch here.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from netsim_ddp.common.tails import SLOW_THRESHOLD, slow_iterations
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples
from netsim_ddp.workload.contract.noise_draws import NoiseModel

INITIAL_STATE = "initial"  # fabric.schedule's label of an iteration before any change
COMPUTE_EXPLAINS = 0.5  # of an iteration's excess: a compute excess this large is its cause
CAUSES = ("stall", "compute", "timeout", "network")
JOB_TIMEOUTS = re.compile(r"^job n\d+->n\d+ timeouts$")  # connection_sampler's names


@dataclass(frozen=True)
class CounterSeries:
    """A counter sampled on one node during the run: (CLOCK_MONOTONIC s, value) in time order,
    e.g. 'qdisc drops' or 'TCP retransmissions'. Its growth inside an iteration's window is
    network evidence for that iteration."""

    name: str
    node: int | None  # None: the whole fabric
    samples: Sequence[tuple[float, float]]

    def _at(self, when: float) -> float:
        index = bisect.bisect_right([t for t, _ in self.samples], when) - 1
        return self.samples[index][1] if index >= 0 else self.samples[0][1]

    def growth(self, start: float, end: float) -> float:
        """How much the counter grew between the last sample before `start` and the last one
        before `end` (a coarse sample makes the window wider, never hides growth)."""
        if not self.samples:
            return 0.0
        later = next((value for t, value in self.samples if t >= end), self.samples[-1][1])
        return later - self._at(start)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SlowIteration(_Strict):
    """One slow iteration and its cause."""

    iteration: int = Field(description="Measured iteration (0: the first after warm-up).")
    excess_s: float = Field(description="Its time over the median iteration (target s).")
    rank: int = Field(description="The rank that was last: whose backward finished last, "
                      "else whose compute was longest.")
    cause: str = Field(description="stall, compute, timeout or network.")
    detail: str = Field(description="The evidence, as people read it.")
    evidenced: bool = Field(False, description="Whether the run's evidence names the cause "
                            "(False: 'network' by elimination, nothing else explained it).")


class CauseShare(_Strict):
    """What one cause explains of the tail."""

    cause: str
    iterations: int
    excess_s: float = Field(description="Summed excess over the median of its iterations.")
    share: float = Field(description="Its share of the tail's summed excess (0..1).")


class TailAttribution(_Strict):
    """The slow iterations of one mode, each with its cause, and the shares per cause."""

    threshold: float = Field(SLOW_THRESHOLD, description="Slow: above the median by more than "
                             "this fraction of it.")
    iterations: int = Field(description="Measured iterations.")
    slow: list[SlowIteration]
    shares: list[CauseShare]


def _last_rank(result: ModeResult, index: int, compute: dict[int, float]) -> int:
    if result.stragglers is not None and index < len(result.stragglers):
        return result.stragglers[index].rank
    return max(compute, key=compute.__getitem__)


def _step_losses(rank: RankSamples, index: int) -> dict[str, int]:
    """The TCP loss counters that grew in the rank's node during the step (its leader's)."""
    losses = rank.step_tcp_loss
    return losses[index] if losses is not None and index < len(losses) else {}


def _window(result: ModeResult, index: int) -> tuple[float, float] | None:
    """The iteration's (start, end) in CLOCK_MONOTONIC host seconds, where recorded."""
    starts = result.started_monotonic
    host = (result.host_s or {}).get("iteration_s") or [t * result.dilation
                                                         for t in result.iteration_s]
    if starts is None or index >= len(starts):
        return None
    return starts[index], starts[index] + host[index]


def _network_evidence(result: ModeResult, index: int, counters: Sequence[CounterSeries],
                      link_states: Sequence[str] | None) -> list[str]:
    found = []
    for rank in result.ranks:  # each node's leader: its TCP losses during the step
        losses = _step_losses(rank, index)
        if losses:
            node = rank.node_rank if rank.node_rank is not None else rank.rank
            found.append(f"node {node} " + ", ".join(f"{name} +{value}"
                                                     for name, value in losses.items()))
    window = _window(result, index)
    if window is not None:
        start, end = window
        for series in counters:
            grew = series.growth(start, end)
            if grew > 0:
                where = f"node {series.node} " if series.node is not None else ""
                found.append(f"{where}{series.name} +{grew:g}")
    state = link_states[index] if link_states is not None and index < len(link_states) else ""
    if state and state != INITIAL_STATE:  # the schedule had changed a link (or did, then)
        found.append(f"link schedule: {state}")
    return found


def _job_timed_out(result: ModeResult, index: int, counters: Sequence[CounterSeries]) -> bool:
    """Whether one of the job's connections had a retransmission timeout in the iteration."""
    per_connection = [series for series in counters if JOB_TIMEOUTS.match(series.name)]
    sampled = any(series.name.startswith(("job ", "neighbour ")) for series in counters)
    if sampled:
        window = _window(result, index)
        return window is not None and any(series.growth(*window) > 0
                                          for series in per_connection)
    return any(_step_losses(rank, index).get("TCPTimeouts", 0) > 0 for rank in result.ranks)


def attribute(result: ModeResult, *, noise: NoiseModel | None = None,
              counters: Sequence[CounterSeries] = (),
              link_states: Sequence[str] | None = None,
              threshold: float = SLOW_THRESHOLD) -> TailAttribution:
    """The slow iterations of `result` (in the target's time) and their causes."""
    series = result.iteration_s
    median = statistics.median(series) if series else 0.0
    ranks = [r for r in result.ranks if r.compute_s]
    typical = statistics.median([c for r in ranks for c in r.compute_s]) if ranks else 0.0
    nodes = {r.rank: r.node_rank if r.node_rank is not None else 0 for r in result.ranks}
    recorded = bool(counters) or any(r.step_tcp_loss is not None for r in result.ranks)
    slow = []
    for index in slow_iterations(series, threshold):
        excess = series[index] - median
        compute = {r.rank: r.compute_s[index] for r in ranks if index < len(r.compute_s)}
        rank = _last_rank(result, index, compute) if compute or result.stragglers else -1
        late = max(compute.values(), default=typical) - typical
        slowest = max(compute, key=compute.__getitem__) if compute else rank
        if compute and late >= COMPUTE_EXPLAINS * excess:
            stall = (noise.step(slowest, nodes.get(slowest, 0),
                                result.warmup + index).stall_s if noise is not None else 0.0)
            cause = "stall" if stall >= 0.5 * late else "compute"
            detail = (f"rank {slowest}'s compute {late * 1e3:+.1f} ms over the typical "
                      f"{typical * 1e3:.1f} ms" + (f" (a {stall * 1e3:.1f} ms stall drawn)"
                                                   if stall else ""))
            rank, evidenced = slowest, True
        else:
            evidence = _network_evidence(result, index, counters, link_states)
            timed_out = _job_timed_out(result, index, counters)
            cause, evidenced = "timeout" if timed_out else "network", bool(evidence)
            read = ("no node's TCP loss counters grew" if recorded
                    else "no network counters recorded")
            detail = ("collective slow; " + "; ".join(evidence) if evidence else
                      f"collective slow (compute explains {max(late, 0) * 1e3:.1f} of "
                      f"{excess * 1e3:.1f} ms; {read}: by elimination)")
        slow.append(SlowIteration(iteration=index, excess_s=excess, rank=rank, cause=cause,
                                  detail=detail, evidenced=evidenced))
    total = sum(s.excess_s for s in slow)
    shares = []
    for cause in CAUSES:
        mine = [s for s in slow if s.cause == cause]
        if mine:
            summed = sum(s.excess_s for s in mine)
            shares.append(CauseShare(cause=cause, iterations=len(mine), excess_s=summed,
                                     share=summed / total if total else 0.0))
    return TailAttribution(threshold=threshold, iterations=len(series), slow=slow,
                           shares=shares)


__all__ = ["CAUSES", "COMPUTE_EXPLAINS", "CauseShare", "CounterSeries", "SlowIteration",
           "TailAttribution", "attribute"]
