"""Collective timing in this process, with a one-rank gloo group: the wrapped hook times each
bucket from hand-off to its future's completion, whatever the mode's hook does."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.precision.hooks import SentBytes
from netsim_ddp.precision.modes import Mode, get_mode
from netsim_ddp.workload.ranks.models import build_workload, make_batches
from netsim_ddp.workload.ranks.timing import BucketTimer, register_timed

PARAMS = 200_000
HOLD_S = 0.05


pytestmark = pytest.mark.usefixtures("one_rank_group")  # tests/workload/conftest.py


class SlowNetworkMode(Mode):
    """fp32, but each bucket's all-reduce completes HOLD_S after it is handed over, as if the
    network took that long: the timer must see the future's completion, not the hand-off."""

    def register_comm_hook(self, ddp: DistributedDataParallel, counter: SentBytes) -> None:
        def held(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            buffer = bucket.buffer()
            threading.Timer(HOLD_S, fut.set_result, args=(buffer,)).start()
            return fut

        ddp.register_comm_hook(counter, held)


def one_timed_step(mode: Mode) -> tuple[BucketTimer, SentBytes, float]:
    workload = build_workload("mlp", PARAMS, seed=0)
    ddp = DistributedDataParallel(workload.model, bucket_cap_mb=0.25)
    counter, timer = SentBytes(), BucketTimer(torch.device("cpu"))
    register_timed(mode, ddp, counter, timer)
    inputs, targets = make_batches(workload, 8, 1, seed=0, rank=0)[0]
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        timer.start_step()
        start = time.perf_counter()
        with mode.autocast("cpu"):
            loss = workload.loss_fn(ddp(inputs), targets)
        loss.backward()
        elapsed = time.perf_counter() - start
    return timer, counter, elapsed


@pytest.mark.parametrize("mode", ["fp32", "amp-fp16", "amp-bf16"])
def test_every_bucket_is_timed_inside_the_step(mode: str) -> None:
    timer, _, elapsed = one_timed_step(get_mode(mode))
    intervals = timer.intervals()
    assert len(intervals) >= 2
    for start, end in intervals:
        assert 0 <= start <= end <= elapsed


def test_the_interval_ends_when_the_future_completes() -> None:
    timer, _, elapsed = one_timed_step(SlowNetworkMode())
    intervals = timer.intervals()
    assert len(intervals) >= 2
    assert all(end - start >= HOLD_S for start, end in intervals)
    assert elapsed >= HOLD_S


def test_a_bucket_that_never_completes_is_an_error() -> None:
    timer = BucketTimer(torch.device("cpu"))
    timer.start_step()
    timer._open[0] = time.perf_counter()  # handed over, future never completed
    with pytest.raises(RuntimeError, match="never completed"):
        timer.intervals()
