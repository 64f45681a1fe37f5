"""script_rank's DDP probe and a script's own comm hooks (one process, a gloo group of one): a
model with no hook gets the harness's timed all-reduce; a hook the script registered before
the probe was installed, or one of DDP's built-in C++ hooks, is left alone (a second hook
would make DDP refuse: "can only be called once")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.workload.ranks.script_rank import DdpProbe, install_ddp_probe

WIDTH = 64
PARAMS = 2 * (WIDTH * WIDTH + WIDTH)  # two Linear layers


@pytest.fixture
def probe(one_rank_group, monkeypatch) -> Iterator[DdpProbe]:
    """A probe installed as script_rank installs it; DDP's class is restored afterwards."""
    for name in ("register_comm_hook", "_register_builtin_comm_hook", "forward"):
        monkeypatch.setattr(DistributedDataParallel, name,
                            getattr(DistributedDataParallel, name))
    probe = DdpProbe()
    yield probe


def ddp_model() -> DistributedDataParallel:
    torch.manual_seed(0)
    return DistributedDataParallel(nn.Sequential(nn.Linear(WIDTH, WIDTH),
                                                 nn.Linear(WIDTH, WIDTH)))


def train_step(model: DistributedDataParallel) -> None:
    model(torch.ones(2, WIDTH)).sum().backward()


def test_a_model_without_a_hook_gets_the_timed_all_reduce(probe) -> None:
    install_ddp_probe(probe)
    model = ddp_model()
    probe.take_step()
    train_step(model)
    sent, intervals = probe.take_step()
    assert sent == PARAMS * 4  # every fp32 gradient byte, counted by the harness's hook
    assert intervals and all(end >= start for start, end in intervals)
    assert [m for m, _ in probe.models] == [model] and probe.hooks == []


def test_a_hook_registered_before_the_probe_is_left_alone(probe) -> None:
    model = ddp_model()
    calls = []

    def own_hook(state, bucket):
        calls.append(bucket.buffer().numel())
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
            lambda fut: fut.value()[0])

    model.register_comm_hook(None, own_hook)  # DDP's own method: the probe is not there yet
    install_ddp_probe(probe)
    for _ in range(2):
        train_step(model)  # the probe's first forward must not register a second hook
    assert sum(calls) == 2 * PARAMS  # the script's hook ran both steps, on every gradient
    assert probe.models == [] and probe.take_step() == (0, None)  # untimed, uncounted


def test_a_builtin_cpp_hook_is_left_alone(probe) -> None:
    install_ddp_probe(probe)
    model = ddp_model()
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    for _ in range(2):
        train_step(model)  # no timed all-reduce added at the first forward
    assert probe.hooks == ["BuiltinCommHookType.ALLREDUCE"]
    assert probe.models == [] and probe.take_step() == (0, None)  # a C++ hook runs untimed
    # and DDP still reduced the gradients through it
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
