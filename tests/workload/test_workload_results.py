"""The arithmetic of a result: slowest rank per iteration, comm clamped at zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsim_ddp.workload.contract.mode_result import (
    RankSamples,
    combine,
    exposed_comm,
    read_result,
    slowest,
    write_result,
)


def samples(rank: int, iteration_s: list[float], compute_s: list[float]) -> RankSamples:
    n = len(iteration_s)
    return RankSamples(
        rank=rank,
        local_rank=rank,
        hostname="h",
        iteration_s=iteration_s,
        compute_s=compute_s,
        comm_s=exposed_comm(iteration_s, compute_s),
        sent_bytes=[400] * n,
        buckets=[1] * n,
        wire_dtypes=["float32"],
        loss=[1.0] * n,
        skipped_steps=0,
        param_digest="0" * 16,
    )


META = dict(
    mode="fp32", model="mlp", params=100, params_requested=100, world_size=2,
    local_world_size=2, backend="gloo", device="cpu", socket_ifname="lo", batch_size=4,
    grad_accumulation=1, bucket_size=1024, warmup=0, iterations=3, profiled=False,
)  # fmt: skip


def test_slowest_rank_counts_per_iteration() -> None:
    assert slowest([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_slowest_refuses_ragged_ranks() -> None:
    with pytest.raises(ValueError, match="different numbers"):
        slowest([[1.0, 2.0], [1.0]])


def test_comm_is_clamped_at_zero() -> None:
    assert exposed_comm([0.5, 0.3, 0.2], [0.2, 0.4, 0.2]) == pytest.approx([0.3, 0.0, 0.0])
    with pytest.raises(ValueError):
        exposed_comm([1.0], [1.0, 2.0])


def test_combine_takes_the_job_view() -> None:
    result = combine(
        [
            samples(1, [0.30, 0.10, 0.50], [0.25, 0.20, 0.10]),
            samples(0, [0.20, 0.40, 0.45], [0.10, 0.05, 0.60]),
        ],
        **META,
    )
    assert result.iteration_s == [0.30, 0.40, 0.50]
    assert result.compute_s == [0.25, 0.20, 0.60]
    # Job comm = slowest step minus slowest compute, clamped: not a max of per-rank comms.
    assert result.comm_s == pytest.approx([0.05, 0.20, 0.0])
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.sent_bytes_per_iteration == 400
    assert result.profiler_allreduce_s is None


def test_profiler_times_fold_like_the_rest(tmp_path: Path) -> None:
    ranks = [samples(0, [1.0, 1.0], [0.5, 0.5]), samples(1, [1.0, 1.0], [0.5, 0.5])]
    ranks[0].profiler_allreduce_s = [0.2, 0.4]
    ranks[1].profiler_allreduce_s = [0.3, 0.1]
    result = combine(ranks, **{**META, "iterations": 2, "profiled": True})
    assert result.profiler_allreduce_s == [0.3, 0.4]
    path = write_result(tmp_path, result)
    assert path.name == "result-fp32.json"
    assert read_result(path) == result
    assert not list(tmp_path.glob("*.tmp"))
