"""One mode's measurements as a run judges them: its summaries, its wire accounting and the
numbers derived from them (scaling efficiency, bus bandwidth, stragglers). The checks (gate,
schedule_checks) read it; `to_record()` turns it into the result document's ModeRecord."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from netsim_ddp.common.metrics import Summary, bus_bandwidth, ring_allreduce_lower_bound, summarize
from netsim_ddp.measure.attribution import CounterSeries, TailAttribution, attribute
from netsim_ddp.measure.document import LinkBytesRecord, ModeRecord, StragglerRow, StragglerSummary
from netsim_ddp.measure.target_time import replay_late_s
from netsim_ddp.measure.tcp_evidence import tcp_counters
from netsim_ddp.workload.contract.mode_result import ModeResult
from netsim_ddp.workload.contract.noise_draws import NoiseModel


@dataclass
class ModeReport:
    """One mode's measurements, summaries and wire accounting."""

    result: ModeResult
    wire_bytes_per_iteration: float  # training only: background traffic subtracted
    background_bytes_per_iteration: float
    link_bps: float
    iteration: Summary = field(init=False)
    comm: Summary | None = field(init=False)  # None: no compute-only steps (a user's script)
    compute: Summary | None = field(init=False)
    collective: Summary | None = field(init=False)  # None: a result without collective timing
    node_names: list[str] = field(default_factory=list)  # for the straggler view
    ranks_per_node: int = 1
    link_states: list[str] | None = None  # per iteration (see netsim_ddp.fabric.schedule)
    noise: NoiseModel | None = None  # the replay's seeded noise: names its stalls in the tail
    counters: list[CounterSeries] = field(default_factory=list)  # sampled: the tail's evidence

    def __post_init__(self) -> None:
        self.iteration = summarize(self.result.iteration_s)
        self.comm = summarize(self.result.comm_s) if self.result.has_compute else None
        self.compute = summarize(self.result.compute_s) if self.result.has_compute else None
        self.collective = (summarize(self.result.collective_s)
                           if self.result.collective_s else None)

    def straggler_rows(self) -> list[StragglerRow] | None:
        """Per iteration: the rank (and node) whose backward finished last, and how long the
        first rank waited for it at the collective."""
        if self.result.stragglers is None:
            return None
        rows = []
        nodes = self.rank_nodes()
        for straggler in self.result.stragglers:
            index = nodes.get(straggler.rank, straggler.rank // self.ranks_per_node)
            node = self.node_names[index] if index < len(self.node_names) else None
            rows.append(StragglerRow(rank=straggler.rank, node=node, wait_s=straggler.wait_s))
        return rows

    def rank_nodes(self) -> dict[int, int]:
        """Each global rank's node, as the ranks recorded it (node_rank); torchrun's c10d
        rendezvous does not number ranks node by node, so rank // ranks_per_node would name
        the wrong host. Empty for results that did not record it."""
        return {r.rank: r.node_rank for r in self.result.ranks if r.node_rank is not None}

    def straggler_summary(self) -> StragglerSummary | None:
        """Which rank straggled most often, and the median wait it caused."""
        rows = self.straggler_rows()
        if not rows:
            return None
        (rank, count), = Counter(row.rank for row in rows).most_common(1)
        waits = [row.wait_s for row in rows]
        node = next(row.node for row in rows if row.rank == rank)
        return StragglerSummary(rank=rank, node=node, iterations=count, of=len(rows),
                                median_wait_s=statistics.median(waits), max_wait_s=max(waits))

    def attribution(self) -> TailAttribution:
        """The slow iterations and their causes (measure.attribution)."""
        return attribute(self.result, noise=self.noise, counters=self.counters,
                         link_states=self.link_states)

    @property
    def scaling_efficiency(self) -> float | None:
        return self.compute.median / self.iteration.median if self.compute else None

    @property
    def samples_per_iteration(self) -> int:
        """Samples one optimizer step consumes across all ranks (gradient accumulation too)."""
        r = self.result
        return r.batch_size * r.grad_accumulation * r.world_size

    @property
    def seconds_per_sample(self) -> float:
        """The median step per sample: how modes with different accumulation compare (0: a
        script's samples per step are not known)."""
        samples = self.samples_per_iteration
        return self.iteration.median / samples if samples else 0.0

    @property
    def ring_lower_bound_s(self) -> float:
        return ring_allreduce_lower_bound(self.result.sent_bytes_per_iteration,
                                          self.result.world_size, self.link_bps)

    @property
    def busbw_bps(self) -> float | None:
        """nccl-tests' bus bandwidth of the gradient collectives: the bytes a rank hands them
        per step over the time at least one of them was in flight (collective_s, the union of
        the bucket intervals, so the gaps between buckets while backward runs do not count),
        x 2(n-1)/n. Never from the exposed comm time: when backward overlaps the all-reduce
        that is a sliver of the collectives' time and reads as several times the link. None
        where no collective time was measured (a script's C++ hook): no bound in its place."""
        if self.collective is None or self.collective.median <= 0:
            return None
        return bus_bandwidth(self.result.sent_bytes_per_iteration, self.collective.median,
                             self.result.world_size)

    def to_record(self) -> ModeRecord:
        r = self.result
        return ModeRecord.model_validate({
            "iteration_s": r.iteration_s, "comm_s": r.comm_s, "compute_s": r.compute_s,
            "wire_bytes_per_iteration": self.wire_bytes_per_iteration,
            "background_bytes_per_iteration": self.background_bytes_per_iteration,
            "hook_bytes_per_iteration": r.sent_bytes_per_iteration,
            "collective_s": r.collective_s, "bucket_s": r.bucket_s,
            # When each iteration started, from the first one's start (the window's edge).
            # A scale model's offsets in the target's time, like every duration here.
            "iteration_start_s": ([(t - r.started_monotonic[0]) / r.dilation
                                   for t in r.started_monotonic]
                                  if r.started_monotonic else None),
            "summary": {"iteration_s": self.iteration.as_dict(),
                        **({"comm_s": self.comm.as_dict(), "compute_s": self.compute.as_dict()}
                           if self.comm and self.compute else {}),
                        **({"collective_s": self.collective.as_dict()} if self.collective
                           else {})},
            "stragglers": self.straggler_rows(),
            "attribution": self.attribution(),
            "straggler_summary": self.straggler_summary(),
            "link_states": self.link_states,
            "scaling_efficiency": self.scaling_efficiency,
            "busbw_bps": self.busbw_bps,
            "busbw_over_link": (self.busbw_bps / self.link_bps
                                if self.busbw_bps is not None else None),
            "ring_lower_bound_s": self.ring_lower_bound_s,
            "comm_over_ring_lower_bound": (self.comm.median / self.ring_lower_bound_s
                                           if self.ring_lower_bound_s and self.comm else None),
            "script": r.script.model_dump() if r.script else None,
            "samples_per_iteration": self.samples_per_iteration,
            "seconds_per_sample": self.seconds_per_sample,
            "params": r.params, "world_size": r.world_size, "iterations": r.iterations,
            "skipped_steps": sum(rank.skipped_steps for rank in r.ranks),
            "profiler_allreduce_s": r.profiler_allreduce_s,
            "link_bytes": link_bytes(r),
            "tcp_counters": tcp_counters(r),
            "dilation": r.dilation, "compute_source": r.compute_source, "host_s": r.host_s,
            "replay_late_s": replay_late_s(r),
        }, strict=False)


def link_bytes(result: ModeResult) -> list[LinkBytesRecord]:
    """What each node's NIC sent in the measured window, by the rank that read it (each
    node's local rank 0): every host's own counters, as they were gathered."""
    return [LinkBytesRecord(rank=rank.rank, hostname=rank.hostname, node_rank=rank.node_rank,
                            sent_bytes=end["sent_bytes"] - start["sent_bytes"],
                            sent_packets=end["sent_packets"] - start["sent_packets"],
                            window_s=end["monotonic_s"] - start["monotonic_s"])
            for rank in result.ranks if rank.link_marks
            for start, end in [rank.link_marks]]
