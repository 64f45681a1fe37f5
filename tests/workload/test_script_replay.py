"""Compute replay for a user's script (workload.script_replay): the module handed to DDP stops
computing, its gradients come on the target's schedule, its buckets are the script's own, and
what replay cannot stand in for is refused with the reason."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.ranks.script_replay import ScriptReplay, ScriptReplayError

pytestmark = pytest.mark.usefixtures("one_rank_group")

COMPUTE_S = 0.030


def _config(**extra: object) -> WorkloadConfig:
    return WorkloadConfig(command=["train.py"], compute=f"{COMPUTE_S * 1e3:g}ms", **extra)


class Counting(nn.Module):
    """An MLP that counts its real forwards (replay must not run them)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.forwards += 1
        return {"logits": self.net(x), "index": torch.arange(x.shape[0])}


def test_the_ddp_module_stops_computing_and_releases_gradients_on_schedule() -> None:
    replay = ScriptReplay(_config(optimizer="5ms"), dilation=2.0, rank=0)
    model = Counting()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.05)
    replay.attach(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ready: dict[str, float] = {}

    def mark(name: str) -> None:
        ready.setdefault(name, time.perf_counter())

    for name, param in model.named_parameters():
        param.register_post_accumulate_grad_hook(lambda _p, name=name: mark(name))
    inputs = torch.randn(8, 64)
    for _ in range(3):
        ready.clear()
        started = time.perf_counter()
        out = ddp(inputs)
        loss = nn.functional.cross_entropy(out["logits"], torch.zeros(8, dtype=torch.long))
        loss.backward()
        replay.optimizer_started()
        optimizer.step()
        replay.optimizer_done()
        took = time.perf_counter() - started
        late, scheduled = replay.take_step()
    assert model.forwards <= 1  # meta device (or one no_grad forward for the shapes)
    assert out["logits"].shape == (8, 10) and out["index"].dtype == torch.long
    assert float(out["logits"].abs().sum()) == 0.0
    # Every parameter got its gradient, no earlier than the schedule (k = 2 x 30 ms, a third
    # forward): the first layer's last, at the end of the backward.
    assert set(ready) == {name for name, _ in model.named_parameters()}
    assert ready["net.0.weight"] >= ready["net.2.weight"]
    assert ready["net.0.weight"] - started >= 2 * COMPUTE_S * 0.99
    assert took >= 2 * (COMPUTE_S + 0.005) * 0.99  # the optimizer held to its 5 ms
    assert scheduled == pytest.approx(2 * (COMPUTE_S + 0.005))
    assert late < 2 * COMPUTE_S  # a 2-core host under load may be late, never by a pass
    assert replay.target_compute_s() == pytest.approx(COMPUTE_S + 0.005)


def test_autocast_takes_compute_amp() -> None:
    replay = ScriptReplay(_config(compute_amp="10ms"), dilation=1.0, rank=0)
    ddp = DistributedDataParallel(nn.Linear(16, 16))
    replay.attach(ddp)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        started = time.perf_counter()
        ddp(torch.randn(4, 16)).float().sum().backward()
    took = time.perf_counter() - started
    assert 0.010 * 0.99 <= took < COMPUTE_S  # the amp schedule, not the fp32 one


def test_a_second_ddp_model_a_gpu_model_and_no_model_are_refused() -> None:
    replay = ScriptReplay(_config(), dilation=1.0, rank=0)
    with pytest.raises(ScriptReplayError, match="no DistributedDataParallel model"):
        replay.require_model()
    replay.attach(DistributedDataParallel(nn.Linear(4, 4)))
    replay.require_model()
    with pytest.raises(ScriptReplayError, match="second DistributedDataParallel"):
        replay.attach(DistributedDataParallel(nn.Linear(4, 4)))


def test_fsdp_is_refused() -> None:
    from netsim_ddp.workload.ranks import script_replay

    with pytest.raises(ScriptReplayError, match="FSDP"):
        script_replay._refuse_fsdp(nn.Linear(4, 4))
